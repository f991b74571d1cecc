//! The collective a recorded communication kernel runs: its type as the kernel's name says it
//! ([`collective_type`]), and the kinds and sizes the one-rank-to-n model prices
//! ([`CollectiveKind`], [`CollectiveSize`]).
//!
//! Shared by the facts, the multi-rank matching, the size finder (`link`) and the model
//! (`extrapolate`): it sits below all of them and imports none, so that `link` need not reach up
//! into `extrapolate` for the types it returns.

/// Kernel type of a collective from its kernel name: `AllReduce`, `SendRecv`, `AllGather`,
/// `ReduceScatter`, `Broadcast`, `Reduce`, … (`ncclKernel_AllReduce_RING_LL_Sum_float` →
/// `AllReduce`; `ncclDevKernel_…` and RCCL names likewise).
pub fn collective_type(name: &str) -> &str {
    let rest = name.split_once("Kernel_").map(|(_, r)| r).unwrap_or(name);
    let end = rest.find(['_', '(', ' ']).unwrap_or(rest.len());
    &rest[..end]
}

/// What a collective does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    Reduce,
    SendRecv,
    Barrier,
}

impl CollectiveKind {
    /// From a collective name as PyTorch, NCCL or an execution trace writes it (`allreduce`,
    /// `all_reduce`, `AllReduce`, `all_to_all`, `alltoall_base`, `_allgather_base`, …).
    pub fn parse(name: &str) -> Option<CollectiveKind> {
        let n: String = name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_ascii_lowercase();
        let n = n.strip_prefix("nccl").unwrap_or(&n);
        Some(if n.contains("allreduce") {
            CollectiveKind::AllReduce
        } else if n.contains("reducescatter") {
            CollectiveKind::ReduceScatter
        } else if n.contains("allgather") {
            CollectiveKind::AllGather
        } else if n.contains("alltoall") {
            CollectiveKind::AllToAll
        } else if n.contains("broadcast") {
            CollectiveKind::Broadcast
        } else if n.contains("barrier") {
            CollectiveKind::Barrier
        } else if n.contains("reduce") {
            CollectiveKind::Reduce
        } else if n.contains("sendrecv") || n == "send" || n == "recv" {
            CollectiveKind::SendRecv
        } else {
            return None;
        })
    }
}

/// A collective's type and size in bytes (the full buffer of one rank; for all-gather the output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectiveSize {
    pub kind: CollectiveKind,
    pub bytes: u64,
}

/// Bytes per element of a NCCL kernel's `dtype` arg (`Float`, `Half`, `BFloat16`, `Long`, …).
pub fn nccl_dtype_bytes(d: &str) -> Option<u64> {
    match d.to_ascii_lowercase().as_str() {
        "float" | "float32" | "int" | "int32" | "uint32" => Some(4),
        "half" | "float16" | "bfloat16" | "short" | "int16" => Some(2),
        "double" | "float64" | "long" | "int64" | "uint64" => Some(8),
        "char" | "byte" | "bool" | "int8" | "uint8" => Some(1),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_types_from_kernel_names() {
        assert_eq!(
            collective_type("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"),
            "AllReduce"
        );
        assert_eq!(
            collective_type("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)"),
            "SendRecv"
        );
        assert_eq!(
            collective_type("ncclDevKernel_Broadcast_RING_LL(ncclDevComm*)"),
            "Broadcast"
        );
        assert_eq!(collective_type("weird"), "weird");
    }

    #[test]
    fn kinds_from_every_spelling() {
        for (s, k) in [
            ("allreduce", CollectiveKind::AllReduce),
            ("nccl:all_reduce", CollectiveKind::AllReduce),
            ("AllReduce", CollectiveKind::AllReduce),
            ("all_to_all", CollectiveKind::AllToAll),
            ("alltoall_base", CollectiveKind::AllToAll),
            ("_allgather_base", CollectiveKind::AllGather),
            ("reduce_scatter_tensor", CollectiveKind::ReduceScatter),
            ("broadcast", CollectiveKind::Broadcast),
            ("SendRecv", CollectiveKind::SendRecv),
            ("reduce", CollectiveKind::Reduce),
        ] {
            assert_eq!(CollectiveKind::parse(s), Some(k), "{s}");
        }
        assert_eq!(CollectiveKind::parse("gemm"), None);
    }
}
