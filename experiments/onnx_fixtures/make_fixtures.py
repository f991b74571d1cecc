#!/usr/bin/env python3
"""Build the ONNX fixtures under tests/fixtures/onnx/ with onnx.helper, and record the shapes
ONNX's own shape inference gives for every value (expected_shapes.json), so the Rust importer is
checked against the reference implementation.

    python3 -m venv /tmp/lb-venv && /tmp/lb-venv/bin/pip install onnx numpy
    /tmp/lb-venv/bin/python experiments/onnx_fixtures/make_fixtures.py

Fixtures (weights are what importers need: dims; the small models carry real random values,
resnet50 and bert_base carry dims only, so the files stay small):
  small_cnn.onnx       conv/bn/relu/maxpool, a residual Add, Concat, grouped strided conv,
                       ceil-mode AveragePool, GlobalAveragePool, Flatten, Gemm, Softmax (opset 13)
  encoder_block.onnx   one transformer encoder block: LayerNormalization, MatMul+bias, Reshape
                       with 0-copy dims, Transpose, scaled masked Softmax attention, Gelu, residual
                       Adds, and a Shape/Gather/Mul/Unsqueeze/Concat chain feeding a Reshape (opset 20)
  unsupported_op.onnx  a Relu followed by an LSTM (not supported) — for the error test
  resnet50.onnx        torchvision ResNet-50 (v1.5) structure, batch dim `N` (opset 13)
  bert_base.onnx       BERT-base encoder (12 layers, hidden 768, 12 heads, seq 128) with
                       embeddings and pooler, batch dim `batch` (opset 20)
"""
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "onnx")
rng = np.random.default_rng(7)


class G:
    """A small graph builder: nodes, initializers, unique names."""

    def __init__(self, with_data=True):
        self.nodes, self.inits, self.n, self.with_data = [], [], 0, with_data

    def name(self, p):
        self.n += 1
        return f"{p}_{self.n}"

    def w(self, p, dims, dtype=TensorProto.FLOAT, values=None):
        n = self.name(p)
        if values is not None:
            t = numpy_helper.from_array(np.asarray(values), n)
        elif self.with_data:
            t = numpy_helper.from_array((rng.standard_normal(dims) * 0.1).astype(np.float32), n)
        else:
            t = TensorProto()
            t.name, t.data_type = n, dtype
            t.dims.extend(dims)
        self.inits.append(t)
        return n

    def op(self, op_type, inputs, outputs=1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0], **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self, name, inputs, outputs, opset):
        g = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="trainplan-fixtures")
        m.ir_version = 8
        return m


def conv(g, x, cin, cout, k, s=1, p=0, bias=False, group=1):
    ins = [x, g.w("w", [cout, cin // group, k, k])]
    if bias:
        ins.append(g.w("b", [cout]))
    return g.op("Conv", ins, kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, group=group)


def bn(g, x, c):
    return g.op("BatchNormalization", [x] + [g.w(n, [c]) for n in ("scale", "bias", "mean", "var")])


def small_cnn():
    g = G()
    x = conv(g, "image", 3, 16, 3, p=1)
    x = g.op("Relu", [bn(g, x, 16)])
    x = g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    a = g.op("Relu", [conv(g, x, 16, 16, 3, p=1, bias=True)])
    b = conv(g, x, 16, 16, 1, bias=True)
    y = g.op("Relu", [g.op("Add", [a, b])])
    y = g.op("Concat", [y, x], axis=1)
    y = conv(g, y, 32, 32, 3, s=2, p=1, group=2)
    y = g.op("AveragePool", [y], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    y = g.op("GlobalAveragePool", [y])
    y = g.op("Flatten", [y])
    y = g.op("Gemm", [y, g.w("fc_w", [10, 32]), g.w("fc_b", [10])], transB=1)
    y = g.op("Softmax", [y], axis=-1)
    inp = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])
    out = helper.make_tensor_value_info(y, TensorProto.FLOAT, ["batch", 10])
    return g.model("small_cnn", [inp], [out], 13)


def linear(g, x, din, dout):
    return g.op("Add", [g.op("MatMul", [x, g.w("w", [din, dout])]), g.w("b", [dout])])


def layer_norm(g, x, d):
    return g.op("LayerNormalization", [x, g.w("ln_g", [d]), g.w("ln_b", [d])], axis=-1, epsilon=1e-12)


def encoder_layer(g, x, d, heads, ff, mask):
    dh = d // heads
    split = g.w("split", [4], TensorProto.INT64, values=np.array([0, 0, heads, dh], np.int64))
    merge = g.w("merge", [3], TensorProto.INT64, values=np.array([0, 0, d], np.int64))

    def proj(perm):
        return g.op("Transpose", [g.op("Reshape", [linear(g, x, d, d), split])], perm=perm)

    q, k, v = proj([0, 2, 1, 3]), proj([0, 2, 3, 1]), proj([0, 2, 1, 3])
    s = g.op("MatMul", [q, k])
    s = g.op("Div", [s, g.w("scale", [], values=np.array(np.sqrt(dh), np.float32))])
    s = g.op("Add", [s, mask])
    p = g.op("Softmax", [s], axis=-1)
    c = g.op("Transpose", [g.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
    c = g.op("Reshape", [c, merge])
    x = layer_norm(g, g.op("Add", [linear(g, c, d, d), x]), d)
    h = g.op("Gelu", [linear(g, x, d, ff)])
    return layer_norm(g, g.op("Add", [linear(g, h, ff, d), x]), d)


def encoder_block():
    g = G()
    d, seq = 32, 16
    mask = g.w("mask", [1, 1, 1, seq])
    y = encoder_layer(g, "tokens", d, 4, 4 * d, mask)
    # Flatten batch and sequence the way exporters do: from the runtime shape.
    s = g.op("Shape", ["tokens"])
    b = g.op("Gather", [s, g.w("i0", [], TensorProto.INT64, values=np.array(0, np.int64))], axis=0)
    t = g.op("Gather", [s, g.w("i1", [], TensorProto.INT64, values=np.array(1, np.int64))], axis=0)
    bt = g.op("Unsqueeze", [g.op("Mul", [b, t]), g.w("ax", [1], TensorProto.INT64, values=np.array([0], np.int64))])
    shape = g.op("Concat", [bt, g.w("d", [1], TensorProto.INT64, values=np.array([d], np.int64))], axis=0)
    y = g.op("Reshape", [y, shape])
    inp = helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", seq, d])
    out = helper.make_tensor_value_info(y, TensorProto.FLOAT, ["rows", d])
    return g.model("encoder_block", [inp], [out], 20)


def unsupported_op():
    g = G()
    x = g.op("Relu", ["x"])
    g.op("LSTM", [x, g.w("W", [1, 32, 8]), g.w("R", [1, 32, 8])], outputs=2, hidden_size=8)
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 2, 8])
    out = helper.make_tensor_value_info(g.nodes[-1].output[0], TensorProto.FLOAT, [5, 1, 2, 8])
    return g.model("unsupported_op", [inp], [out], 13)


def resnet50():
    g = G(with_data=False)
    x = conv(g, "input", 3, 64, 7, s=2, p=3)
    x = g.op("Relu", [bn(g, x, 64)])
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for planes, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(blocks):
            s = stride if i == 0 else 1
            y = g.op("Relu", [bn(g, conv(g, x, cin, planes, 1), planes)])
            y = g.op("Relu", [bn(g, conv(g, y, planes, planes, 3, s=s, p=1), planes)])
            y = bn(g, conv(g, y, planes, planes * 4, 1), planes * 4)
            sc = x
            if i == 0:
                sc = bn(g, conv(g, x, cin, planes * 4, 1, s=s), planes * 4)
            x = g.op("Relu", [g.op("Add", [y, sc])])
            cin = planes * 4
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    x = g.op("Gemm", [x, g.w("fc_w", [1000, 2048]), g.w("fc_b", [1000])], transB=1)
    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])
    out = helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", 1000])
    return g.model("resnet50", [inp], [out], 13)


def bert_base():
    g = G(with_data=False)
    d, heads, layers, seq, vocab = 768, 12, 12, 128, 30522
    ids = "input_ids"
    pos = g.w("position_ids", [1, seq], TensorProto.INT64,
              values=np.arange(seq, dtype=np.int64).reshape(1, seq))
    tt = g.w("token_type_ids", [1, seq], TensorProto.INT64, values=np.zeros((1, seq), np.int64))
    e = g.op("Gather", [g.w("word_emb", [vocab, d]), ids])
    e = g.op("Add", [e, g.op("Gather", [g.w("pos_emb", [512, d]), pos])])
    e = g.op("Add", [e, g.op("Gather", [g.w("type_emb", [2, d]), tt])])
    x = layer_norm(g, e, d)
    mask = g.w("mask", [1, 1, 1, seq])
    for _ in range(layers):
        x = encoder_layer(g, x, d, heads, 4 * d, mask)
    first = g.op("Gather", [x, g.w("cls", [], TensorProto.INT64, values=np.array(0, np.int64))], axis=1)
    pooled = g.op("Tanh", [g.op("Gemm", [first, g.w("pool_w", [d, d]), g.w("pool_b", [d])], transB=1)])
    inp = helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", seq])
    outs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", seq, d]),
            helper.make_tensor_value_info(pooled, TensorProto.FLOAT, ["batch", d])]
    return g.model("bert_base", [inp], outs, 20)


def inferred_shapes(m, batch):
    """Every value's shape per onnx.shape_inference at `batch` (the symbolic batch made concrete)."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for i in m.graph.input:
        i.type.tensor_type.shape.dim[0].Clear()
        i.type.tensor_type.shape.dim[0].dim_value = batch
    inf = shape_inference.infer_shapes(m, strict_mode=True)
    out = {}
    for vi in list(inf.graph.value_info) + list(inf.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = dims
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    expected = {}
    for name, build, batch in [("small_cnn", small_cnn, 2), ("encoder_block", encoder_block, 3),
                               ("unsupported_op", unsupported_op, None),
                               ("resnet50", resnet50, 1), ("bert_base", bert_base, 1)]:
        m = build()
        if build not in (resnet50, bert_base):  # the checker wants weight data
            onnx.checker.check_model(m)
        if name != "unsupported_op":
            expected[name] = {"batch": batch, "shapes": inferred_shapes(m, batch)}
        path = os.path.join(OUT, f"{name}.onnx")
        with open(path, "wb") as f:
            f.write(m.SerializeToString())
        print(f"{path}: {os.path.getsize(path)} bytes, {len(m.graph.node)} nodes")
    with open(os.path.join(OUT, "expected_shapes.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
