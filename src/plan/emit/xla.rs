//! TensorFlow / XLA: `xla.env`, `xla_clusters.txt` (dPRO's `XLA_CLUSTER_SPEC`) and
//! `trainplan_xla.py` (the stock-TF alternative).
//!
//! * op fusion → `TF_XLA_FLAGS=--tf_xla_auto_jit=2`, and one cluster per fused op group in
//!   `xla_clusters.txt`, `<tf_node> <cluster_id>` per line, for dPRO's TF fork
//!   (`XLA_CLUSTER_SPEC=xla_clusters.txt`). Node names: a forward member `L FW` is the node `L`,
//!   a backward member `L BW` is `gradients/L_grad` (TF's gradient name scope), an update
//!   `L UPDATE` is `L/update`. Clusters must be acyclic: the planner checked that on the op graph
//!   when it fused (the op-fusion pass refuses a merge that closes a cycle); the plan holds
//!   names only, so here each node is put in one cluster — clusters sharing a node are merged,
//!   duplicates dropped ([`super::merge_clusters`]) — and the file has no node twice (tested);
//!   a node name is one field ([`super::escape::record_field`]);
//! * stock TF → `trainplan_xla.py`: `apply_to_graph(graph)` sets `_XlaCompile=True` and
//!   `_XlaScope=trainplan_cluster_N` on each cluster's ops; `jit_scope()` for eager code;
//! * exact tensor groups → `XLA_FLAGS=--xla_gpu_all_reduce_combine_threshold_bytes=<largest
//!   group>` when the plan fuses tensors;
//! * AMP → the Keras mixed-precision policy (`mixed_float16` / `mixed_bfloat16`) in the module;
//!   recomputation → the module lists the modules for `tf.recompute_grad`.

use super::escape::record_field;
use super::horovod::names_doc;
use super::{
    EmitError, Emitted, Facts, comment_text, env_line, header, py_list, py_str, split_member,
    unmapped_passes,
};
use crate::plan::Plan;

/// The TF node name of a `layer PHASE` member.
pub fn tf_node(member: &str) -> String {
    let (layer, phase) = split_member(member);
    let l = layer.replace(' ', "_");
    match phase {
        "BW" => format!("gradients/{l}_grad"),
        "UPDATE" => format!("{l}/update"),
        _ => l,
    }
}

/// `xla_clusters.txt` lines: `(node, cluster id)`, each node once.
pub fn cluster_lines(f: &Facts) -> Vec<(String, usize)> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (id, c) in f.clusters.iter().enumerate() {
        for m in c {
            let n = tf_node(m);
            if seen.insert(n.clone()) {
                out.push((n, id));
            }
        }
    }
    out
}

pub(super) fn emit(plan: &Plan, f: &Facts) -> Result<Emitted, EmitError> {
    let mut notes = Vec::new();
    let mut files = Vec::new();
    let lines = cluster_lines(f);
    let mut env = header(
        plan,
        "TensorFlow/XLA environment — `set -a; . ./xla.env; set +a`",
    );
    let mut xla_flags = Vec::new();
    if !lines.is_empty() {
        env.push_str("# the planned op fusion: XLA auto-clustering with the plan's clusters\n");
        env.push_str(&env_line("TF_XLA_FLAGS", "--tf_xla_auto_jit=2")?);
        env.push_str("# dPRO's TF fork reads the clusters from this file (make the path absolute if you run elsewhere)\n");
        env.push_str(&env_line("XLA_CLUSTER_SPEC", "xla_clusters.txt")?);
    }
    if f.fuses_tensors() {
        match f.largest_group_bytes() {
            Some(b) => xla_flags.push(format!("--xla_gpu_all_reduce_combine_threshold_bytes={b}")),
            None => notes.push("the plan has no tensor_bytes: set --xla_gpu_all_reduce_combine_threshold_bytes to the largest group's bytes".into()),
        }
    }
    if !xla_flags.is_empty() {
        env.push_str(
            "# planned tensor fusion: all-reduces combined up to the largest planned group\n",
        );
        env.push_str(&env_line("XLA_FLAGS", &xla_flags.join(" "))?);
    }
    files.push(("xla.env".to_string(), env));
    if !lines.is_empty() {
        let mut txt = header(plan, "XLA cluster spec: `<tf_node> <cluster_id>` per line");
        txt.push_str("# one cluster per planned fused op group; acyclicity was checked by the planner when it fused\n");
        txt.push_str("# a node name is one field: whitespace, backslashes, control and non-ASCII characters as \\ escapes (\\x20, \\n, \\xe9)\n");
        for (n, id) in &lines {
            txt.push_str(&format!("{} {id}\n", record_field(n)));
        }
        files.push(("xla_clusters.txt".to_string(), txt));
        notes.push(format!(
            "{} XLA clusters over {} nodes: with dPRO's TF fork set XLA_CLUSTER_SPEC; with stock TF call trainplan_xla.apply_to_graph(graph) before the session runs",
            f.clusters.len(),
            lines.len()
        ));
    } else {
        notes.push("the plan fuses no ops: no cluster file".into());
    }

    let mut py = format!(
        "\"\"\"Apply a trainplan plan's op fusion and precision to stock TensorFlow.\n\n    import trainplan_xla\n    trainplan_xla.apply_to_graph(tf.compat.v1.get_default_graph())   # graph mode\n    trainplan_xla.set_precision_policy()                                # Keras\n\nThe plan and whose names it uses are in the comments below.\n\"\"\"\n\n{}# names: {}\n",
        header(plan, "stock-TF XLA scopes"),
        comment_text(&names_doc(plan))
    );
    py.push_str("# Node name -> cluster id (the plan's fused op groups).\nCLUSTERS = {\n");
    for (n, id) in &lines {
        py.push_str(&format!("    {}: {id},\n", py_str(n)));
    }
    py.push_str("}\n");
    py.push_str(&format!(
        "PRECISION_POLICY = {}\n",
        py_str(match f.half.as_deref() {
            Some("bf16") => "mixed_bfloat16",
            Some(_) => "mixed_float16",
            None => "float32",
        })
    ));
    py.push_str(&format!(
        "# Wrap these in tf.recompute_grad (the planned recomputation).\nRECOMPUTE_MODULES = {}\n",
        py_list(&f.recompute, "")
    ));
    py.push_str(&format!("GRAD_ACCUMULATION = {}\n", f.k));
    py.push_str(XLA_PY);
    files.push(("trainplan_xla.py".to_string(), py));
    if f.k > 1 {
        notes.push(format!(
            "gradient accumulation: apply gradients every {} micro-batches (gradient_accumulation_steps={})",
            f.k, f.k
        ));
    }
    notes.extend(unmapped_passes(f, &["amp"], "TensorFlow/XLA"));
    Ok(Emitted { files, notes })
}

const XLA_PY: &str = r#"

def cluster_of(node_name):
    """The planned cluster of a node (by exact name or name scope), or None."""
    name = node_name
    while name:
        if name in CLUSTERS:
            return CLUSTERS[name]
        if "/" not in name:
            return None
        name = name.rsplit("/", 1)[0]
    return None


def apply_to_graph(graph=None):
    """Mark every op of a planned cluster with _XlaCompile/_XlaScope; returns the count."""
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2

    graph = graph or tf.compat.v1.get_default_graph()
    marked = 0
    for op in graph.get_operations():
        cid = cluster_of(op.name)
        if cid is None:
            continue
        op._set_attr("_XlaCompile", attr_value_pb2.AttrValue(b=True))
        op._set_attr("_XlaScope", attr_value_pb2.AttrValue(s=("trainplan_cluster_%d" % cid).encode()))
        marked += 1
    if CLUSTERS and not marked:
        raise ValueError("no op of the graph is in a planned cluster, e.g. %s" % next(iter(CLUSTERS)))
    return marked


def jit_scope():
    """An XLA JIT scope for code built eagerly inside it."""
    import tensorflow as tf

    return tf.xla.experimental.jit_scope(compile_ops=True, separate_compiled_gradients=True)


def set_precision_policy():
    """The planned Keras mixed-precision policy."""
    import tensorflow as tf

    tf.keras.mixed_precision.set_global_policy(PRECISION_POLICY)
"#;

#[cfg(test)]
mod tests {
    use super::super::tests::{check_env, check_files, file, tiny_plan};
    use super::super::{Framework, emit};

    #[test]
    fn tiny_plan_env_clusters_and_module() {
        let e = emit(&tiny_plan(), Framework::Xla).unwrap();
        check_files(&e);
        let env = check_env(file(&e, "xla.env"));
        assert_eq!(env["TF_XLA_FLAGS"], "--tf_xla_auto_jit=2");
        assert_eq!(env["XLA_CLUSTER_SPEC"], "xla_clusters.txt");
        // Largest group 4 MiB + 2 KiB.
        assert_eq!(
            env["XLA_FLAGS"],
            "--xla_gpu_all_reduce_combine_threshold_bytes=4196352"
        );
        let txt = file(&e, "xla_clusters.txt");
        let body: Vec<&str> = txt.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            body,
            vec![
                "net.1 0",
                "act.1 0",
                "gradients/net.3_grad 1",
                "gradients/act.3_grad 1"
            ]
        );
        let nodes: std::collections::BTreeSet<&str> =
            body.iter().map(|l| l.split(' ').next().unwrap()).collect();
        assert_eq!(nodes.len(), body.len(), "a node in two clusters");
        let py = file(&e, "trainplan_xla.py");
        assert!(py.contains("    \"gradients/net.3_grad\": 1,\n"));
        assert!(py.contains("PRECISION_POLICY = \"mixed_float16\""));
    }

    #[test]
    fn no_fusion_no_cluster_file() {
        let mut p = tiny_plan();
        p.config.fused_ops.clear();
        p.config.tensor_groups = p
            .config
            .tensor_groups
            .iter()
            .flatten()
            .map(|t| vec![t.clone()])
            .collect();
        p.config.partitions.clear();
        let e = emit(&p, Framework::Xla).unwrap();
        assert!(e.files.iter().all(|(n, _)| n != "xla_clusters.txt"));
        let env = check_env(file(&e, "xla.env"));
        assert!(env.is_empty(), "{env:?}");
        check_files(&e);
    }
}
