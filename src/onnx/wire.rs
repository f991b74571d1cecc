//! Locate a protobuf decode error: prost says *what* broke (`NodeProto.input: invalid wire
//! type`) but not *where*. This walks the raw wire format of an ONNX model with a small table of
//! which field holds which message, and returns the byte offset of the first field that is
//! structurally broken (truncated, an impossible length, a wrong wire type, a bad string).

/// The ONNX messages the walk descends into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Msg {
    Model,
    Graph,
    Node,
    Attr,
    Tensor,
    ValueInfo,
    Type,
    TypeTensor,
    Shape,
    Dim,
    OpsetId,
}

/// What a field of a message is, as far as the wire format goes.
enum Field {
    Message(Msg),
    Text,
    /// Varint scalar, or a packed repeated number (wire type 0 or 2).
    Number,
    Float32,
    Unknown,
}

fn field(m: Msg, tag: u64) -> Field {
    use Field::*;
    use Msg::*;
    match (m, tag) {
        (Model, 7) => Message(Graph),
        (Model, 8) => Message(OpsetId),
        (Model, 2 | 3 | 4 | 6) => Text,
        (Model, 1 | 5) => Number,
        (Graph, 1) => Message(Node),
        (Graph, 5) => Message(Tensor),
        (Graph, 11..=13) => Message(ValueInfo),
        (Graph, 2 | 10) => Text,
        (Node, 5) => Message(Attr),
        (Node, 1..=4 | 6 | 7) => Text,
        (Attr, 5 | 10) => Message(Tensor),
        (Attr, 6 | 11) => Message(Graph),
        (Attr, 1 | 13 | 21) => Text,
        (Attr, 3 | 8 | 20) => Number,
        (Attr, 2) => Float32,
        (Tensor, 8 | 12) => Text,
        (Tensor, 1 | 2 | 5 | 7 | 14) => Number,
        (ValueInfo, 2) => Message(Type),
        (ValueInfo, 1 | 3) => Text,
        (Type, 1) => Message(TypeTensor),
        (TypeTensor, 1) => Number,
        (TypeTensor, 2) => Message(Shape),
        (Shape, 1) => Message(Dim),
        (Dim, 1) => Number,
        (Dim, 2 | 3) => Text,
        (OpsetId, 1) => Text,
        (OpsetId, 2) => Number,
        _ => Unknown,
    }
}

fn name(m: Msg) -> &'static str {
    match m {
        Msg::Model => "ModelProto",
        Msg::Graph => "GraphProto",
        Msg::Node => "NodeProto",
        Msg::Attr => "AttributeProto",
        Msg::Tensor => "TensorProto",
        Msg::ValueInfo => "ValueInfoProto",
        Msg::Type => "TypeProto",
        Msg::TypeTensor => "TypeProto.Tensor",
        Msg::Shape => "TensorShapeProto",
        Msg::Dim => "TensorShapeProto.Dimension",
        Msg::OpsetId => "OperatorSetIdProto",
    }
}

/// Read a varint at `*pos`; `None` when truncated or longer than 10 bytes.
fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The offset and description of the first broken field of an ONNX model, if any.
pub fn locate(buf: &[u8]) -> Option<(usize, String)> {
    walk(buf, 0, Msg::Model, 0).err()
}

fn walk(buf: &[u8], base: usize, m: Msg, depth: u32) -> Result<(), (usize, String)> {
    if depth > 64 {
        return Err((base, "nesting deeper than 64 messages".into()));
    }
    let mut pos = 0usize;
    while pos < buf.len() {
        let start = pos;
        let at = |what: String| (base + start, format!("{} {what}", name(m)));
        let key = varint(buf, &mut pos).ok_or_else(|| at("field key is truncated".into()))?;
        let (tag, wt) = (key >> 3, key & 7);
        if tag == 0 {
            return Err(at("has a field number 0".into()));
        }
        let f = field(m, tag);
        let wrong = |wt: u64| at(format!("field {tag} has the wrong wire type {wt}"));
        match wt {
            0 => {
                if !matches!(f, Field::Number | Field::Unknown) {
                    return Err(wrong(wt));
                }
                varint(buf, &mut pos)
                    .ok_or_else(|| at(format!("field {tag}: truncated varint")))?;
            }
            1 | 5 => {
                let n = if wt == 1 { 8 } else { 4 };
                if !matches!(f, Field::Unknown | Field::Float32 | Field::Number) {
                    return Err(wrong(wt));
                }
                if pos + n > buf.len() {
                    return Err(at(format!("field {tag}: truncated ({n}-byte value)")));
                }
                pos += n;
            }
            2 => {
                let len = varint(buf, &mut pos)
                    .ok_or_else(|| at(format!("field {tag}: truncated length")))?;
                let remaining = (buf.len() - pos) as u64;
                if len > remaining {
                    return Err(at(format!(
                        "field {tag} claims {len} bytes but only {remaining} remain (truncated file?)"
                    )));
                }
                let body = &buf[pos..pos + len as usize];
                match f {
                    Field::Message(child) => walk(body, base + pos, child, depth + 1)?,
                    Field::Text if std::str::from_utf8(body).is_err() => {
                        return Err(at(format!("field {tag}: string is not UTF-8")));
                    }
                    Field::Float32 => return Err(wrong(wt)),
                    _ => {}
                }
                pos += len as usize;
            }
            _ => return Err(at(format!("field {tag} has an invalid wire type {wt}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_is_located_at_the_field_that_overruns() {
        // ModelProto { ir_version: 8 (field 1), graph (field 7) with 5 bytes declared, 2 given }.
        let buf = [0x08, 0x08, 0x3a, 0x05, 0x0a, 0x00];
        let (off, what) = locate(&buf).unwrap();
        assert_eq!(off, 2);
        assert!(
            what.contains("field 7 claims 5 bytes but only 2 remain"),
            "{what}"
        );
    }

    #[test]
    fn nested_errors_carry_absolute_offsets() {
        // graph { node { op_type: "\xff" } }: the bad string sits at offset 4 of the file.
        let buf = [0x3a, 0x05, 0x0a, 0x03, 0x22, 0x01, 0xff];
        let (off, what) = locate(&buf).unwrap();
        assert_eq!(
            (off, what.as_str()),
            (4, "NodeProto field 4: string is not UTF-8")
        );
    }

    #[test]
    fn a_valid_message_has_no_error() {
        assert_eq!(
            locate(&[0x08, 0x07, 0x42, 0x04, 0x10, 0x11, 0x0a, 0x00]),
            None
        );
    }
}
