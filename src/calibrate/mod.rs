//! `trainplan calibrate`: measure a GPU's achievable peaks and write them as a GPU profile in the
//! format of `configs/gpus/*.yaml`, which the cost models (`crate::cost`) and `lower-bound
//! --gpu FILE` read.
//!
//! The measurements themselves (`cuda.rs`) exist only with the cargo feature `gpu` (cudarc,
//! loading the NVIDIA driver, cuBLAS and NVRTC dynamically at run time, so building needs no CUDA
//! toolkit). This module holds what does not need a GPU: the result, its translation into a
//! [`GpuSpec`], and the YAML text, parsed back with `crate::cost::config::parse_gpu` before it is
//! written.
//!
//! Translation. The roofline (`crate::cost::compute`) multiplies each peak by an efficiency factor
//! (matrix 0.70, memory 0.80, vector 0.50). A calibrated profile stores the *achieved* GEMM
//! throughput divided by the matrix factor and the achieved copy bandwidth divided by the memory
//! factor, so that the model reproduces what was measured; the FMA-loop throughput is already a
//! peak and is stored as measured. Peaks that were not measured (fp64, fp8, 16-bit vector) come
//! from the built-in config of the same GPU when the device name matches one.

#[cfg(feature = "gpu")]
pub mod cuda;

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::cost::config::{self, ConfigError, Dtype, GpuSpec};
use crate::lowerbound::report::dtype_name;

/// The message of a build without the `gpu` feature.
pub const NO_GPU_FEATURE: &str = "trainplan was built without the `gpu` feature, so it cannot \
     measure a GPU; rebuild with `cargo build --release --features gpu` (the NVIDIA driver is \
     needed at run time, no CUDA toolkit at build time)";

/// Fused against unfused element-wise work: `ops` multiply-adds applied to `elems` fp32 values.
#[derive(Clone, Debug, PartialEq)]
pub struct Chain {
    pub ops: u32,
    pub elems: u64,
    /// `ops` kernels, one operation each (every one reads and writes the whole array).
    pub unfused_ms: f64,
    /// One NVRTC kernel applying all `ops` in registers.
    pub fused_ms: f64,
}

/// What one calibration run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// The device's name as the driver reports it (`NVIDIA H200`).
    pub device: String,
    pub memory_gib: f64,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// CUDA compute capability (major, minor): 7.0 Volta, 8.0 Ampere, 9.0 Hopper.
    pub compute_capability: (u32, u32),
    /// Best achieved GEMM throughput per dtype over the sizes tried, TFLOP/s.
    pub gemm_tflops: BTreeMap<Dtype, f64>,
    /// GEMM sizes tried (square n×n×n).
    pub gemm_sizes: Vec<u64>,
    /// FP32 FMA-loop throughput, TFLOP/s.
    pub vector_fp32_tflops: f64,
    /// Best device-to-device copy bandwidth, bytes read + written per ns (GB/s).
    pub copy_gbps: f64,
    /// GPU time per launch of an empty kernel, back to back, µs.
    pub launch_us: f64,
    pub chain: Option<Chain>,
}

/// `NVIDIA H200` → `nvidia-h200`.
pub fn slug(device: &str) -> String {
    let mut s = String::new();
    for c in device.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') && !s.is_empty() {
            s.push('-');
        }
    }
    s.trim_end_matches('-').to_string()
}

/// The built-in GPU config a device name refers to, if any (`Tesla V100-SXM2-32GB` →
/// `v100-32gb`): the one whose `model` or name shares the device's distinguishing token.
pub fn builtin_for(device: &str) -> Option<GpuSpec> {
    let d = device.to_ascii_lowercase();
    let token = |t: &str| d.contains(t);
    let name = if token("h200") {
        "h200"
    } else if token("h100") {
        "h100-sxm"
    } else if token("a100") {
        "a100-80gb"
    } else if token("v100") {
        "v100-32gb"
    } else if token("mi300x") {
        "mi300x"
    } else {
        return None;
    };
    config::load_gpu(name).ok()
}

/// The architecture of a compute capability (`None` for one trainplan has no constants for).
pub fn arch_of(cc: (u32, u32)) -> Option<&'static str> {
    match cc.0 {
        7 => Some("volta"),
        8 => Some("ampere"),
        9 | 10 => Some("hopper"),
        _ => None,
    }
}

/// The GPU description a calibration gives (see the module docs for the translation).
pub fn to_spec(m: &Measured, name: &str, base: Option<&GpuSpec>) -> Result<GpuSpec, ConfigError> {
    let arch_name = match base {
        Some(b) => b.arch.clone(),
        None => arch_of(m.compute_capability)
            .ok_or_else(|| ConfigError::File {
                file: format!("{name}.yaml"),
                message: format!(
                    "compute capability {}.{} has no kernel-efficiency constants in configs/arch/",
                    m.compute_capability.0, m.compute_capability.1
                ),
            })?
            .to_string(),
    };
    let arch = config::load_gpu_arch(&arch_name)?;
    let mut matrix: BTreeMap<Dtype, f64> =
        base.map(|b| b.matrix_tflops.clone()).unwrap_or_default();
    for (&d, &t) in &m.gemm_tflops {
        let e = match d {
            Dtype::Fp32 | Dtype::Fp64 => arch.gemm_efficiency.cuda_core,
            _ => arch.gemm_efficiency.tensor_core,
        };
        matrix.insert(d, round2(t / e));
    }
    let mut vector: BTreeMap<Dtype, f64> =
        base.map(|b| b.vector_tflops.clone()).unwrap_or_default();
    vector.insert(Dtype::Fp32, round2(m.vector_fp32_tflops));
    Ok(GpuSpec {
        name: name.to_string(),
        model: m.device.clone(),
        vendor: base.map_or_else(|| "nvidia".to_string(), |b| b.vendor.clone()),
        matrix_tflops: matrix,
        vector_tflops: vector,
        memory_gbps: round2(m.copy_gbps / arch.memory_efficiency),
        memory_gib: round2(m.memory_gib),
        launch_overhead_us: round2(m.launch_us),
        arch: arch_name,
        sms: m.sms,
        boost_clock_mhz: base.map_or(1000.0, |b| b.boost_clock_mhz),
        host_link_gbps: base.and_then(|b| b.host_link_gbps),
        source: "trainplan calibrate (measured)".into(),
        kernels: arch,
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The profile as YAML in the `configs/gpus/` format, with the raw measurements as comments.
/// The text is parsed back with the config loader; a profile it would refuse is an error.
pub fn profile_yaml(
    m: &Measured,
    spec: &GpuSpec,
    base: Option<&GpuSpec>,
) -> Result<String, ConfigError> {
    let a = &spec.kernels;
    let measured = [
        ("copy bandwidth", m.copy_gbps),
        ("FMA throughput", m.vector_fp32_tflops),
        ("launch overhead", m.launch_us),
    ]
    .into_iter()
    .chain(m.gemm_tflops.values().map(|&t| ("GEMM throughput", t)));
    for (what, v) in measured {
        if !(v.is_finite() && v > 0.0) {
            return Err(ConfigError::File {
                file: format!("{}.yaml", spec.name),
                message: format!("the {what} measurement is {v}, not a positive number"),
            });
        }
    }
    let mut y = String::new();
    let _ = writeln!(
        y,
        "# {} measured by `trainplan calibrate` (trainplan {}).",
        m.device,
        env!("CARGO_PKG_VERSION")
    );
    let gemm: Vec<String> = m
        .gemm_tflops
        .iter()
        .map(|(d, t)| format!("{} {t:.1}", dtype_name(*d)))
        .collect();
    let sizes: Vec<String> = m.gemm_sizes.iter().map(|s| s.to_string()).collect();
    let _ = writeln!(
        y,
        "# cuBLAS GEMM, best of n = {} (n×n×n): {} TFLOP/s achieved; matrix_tflops = achieved / the {} GEMM efficiency ({:.2} CUDA cores, {:.2} tensor cores).",
        sizes.join(", "),
        gemm.join(", "),
        a.name,
        a.gemm_efficiency.cuda_core,
        a.gemm_efficiency.tensor_core
    );
    let _ = writeln!(
        y,
        "# Device-to-device copy: {:.0} GB/s achieved (bytes read + written); memory_gbps = achieved / {:.2}.",
        m.copy_gbps, a.memory_efficiency
    );
    let _ = writeln!(
        y,
        "# FP32 FMA loop: {:.1} TFLOP/s (stored as the fp32 vector peak).",
        m.vector_fp32_tflops
    );
    let _ = writeln!(
        y,
        "# Empty kernel, back-to-back launches: {:.2} us each.",
        m.launch_us
    );
    if let Some(c) = &m.chain {
        let _ = writeln!(
            y,
            "# Element-wise chain of {} multiply-adds on {} fp32 values: {} kernels {:.3} ms, one fused kernel {:.3} ms ({:.1}x).",
            c.ops,
            c.elems,
            c.ops,
            c.unfused_ms,
            c.fused_ms,
            c.unfused_ms / c.fused_ms.max(1e-9)
        );
    }
    match base {
        Some(b) => {
            let _ = writeln!(
                y,
                "# Not measured, from the built-in {}: the other dtypes' peaks.",
                b.name
            );
        }
        None => {
            let _ = writeln!(
                y,
                "# Not measured: fp64, fp8 and 16-bit vector peaks (no built-in config matches this device)."
            );
        }
    }
    let _ = writeln!(y, "name: {}", spec.name);
    let _ = writeln!(y, "model: {}", yaml_str(&spec.model));
    let _ = writeln!(y, "vendor: {}", yaml_str(&spec.vendor));
    for (key, map) in [
        ("matrix_tflops", &spec.matrix_tflops),
        ("vector_tflops", &spec.vector_tflops),
    ] {
        if map.is_empty() {
            let _ = writeln!(y, "{key}: {{}}");
            continue;
        }
        let _ = writeln!(y, "{key}:");
        for (d, v) in map {
            let _ = writeln!(y, "  {}: {v:?}", dtype_name(*d));
        }
    }
    let _ = writeln!(y, "memory_gbps: {:?}", spec.memory_gbps);
    let _ = writeln!(y, "memory_gib: {:?}", spec.memory_gib);
    let _ = writeln!(y, "launch_overhead_us: {:?}", spec.launch_overhead_us);
    let _ = writeln!(y, "arch: {}", yaml_str(&spec.arch));
    let _ = writeln!(y, "sms: {}", spec.sms);
    let _ = writeln!(y, "boost_clock_mhz: {:?}", spec.boost_clock_mhz);
    if let Some(h) = spec.host_link_gbps {
        let _ = writeln!(y, "host_link_gbps: {h:?}");
    }
    let _ = writeln!(y, "source: {}", yaml_str(&spec.source));
    let back = config::parse_gpu(&y, &format!("{}.yaml", spec.name))?;
    if &back != spec {
        return Err(ConfigError::File {
            file: format!("{}.yaml", spec.name),
            message: "the written profile does not read back as the measured one (a bug)".into(),
        });
    }
    Ok(y)
}

/// A YAML scalar, quoted when plain style would change its meaning.
fn yaml_str(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || " -_.()/".contains(c))
        && !s.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == ' ')
        && !s.ends_with(' ');
    if plain {
        s.to_string()
    } else {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200_run() -> Measured {
        Measured {
            device: "NVIDIA H200".into(),
            memory_gib: 139.8,
            gemm_tflops: [
                (Dtype::Fp32, 51.0),
                (Dtype::Tf32, 370.0),
                (Dtype::Fp16, 720.0),
                (Dtype::Bf16, 700.0),
            ]
            .into_iter()
            .collect(),
            gemm_sizes: vec![2048, 4096, 8192],
            vector_fp32_tflops: 60.5,
            copy_gbps: 4000.0,
            launch_us: 2.2,
            sms: 132,
            compute_capability: (9, 0),
            chain: Some(Chain {
                ops: 8,
                elems: 1 << 26,
                unfused_ms: 1.1,
                fused_ms: 0.14,
            }),
        }
    }

    #[test]
    fn profile_reads_back_and_reproduces_the_measurements() {
        let m = h200_run();
        let base = builtin_for(&m.device);
        assert_eq!(base.as_ref().map(|b| b.name.as_str()), Some("h200"));
        let spec = to_spec(&m, &slug(&m.device), base.as_ref()).unwrap();
        let y = profile_yaml(&m, &spec, base.as_ref()).unwrap();
        let back = config::parse_gpu(&y, "p.yaml").unwrap();
        assert_eq!(back.name, "nvidia-h200");
        assert_eq!((back.arch.as_str(), back.sms), ("hopper", 132));
        // The architecture's efficiencies give back the achieved GEMM and copy rates.
        let a = &back.kernels;
        let fp16 = back.matrix_tflops[&Dtype::Fp16] * a.gemm_efficiency.tensor_core;
        assert!((fp16 - 720.0).abs() < 0.01, "{fp16}");
        let copy = back.memory_gbps * a.memory_efficiency;
        assert!((copy - 4000.0).abs() < 0.01, "{copy}");
        assert_eq!(back.vector_tflops[&Dtype::Fp32], 60.5);
        // Not measured: carried over from the built-in H200.
        assert_eq!(back.matrix_tflops[&Dtype::Fp8], 1979.0);
        assert_eq!(back.launch_overhead_us, 2.2);
        assert!(y.contains("one fused kernel 0.140 ms (7.9x)"), "{y}");
    }

    #[test]
    fn unknown_device_gets_only_measured_peaks() {
        let mut m = h200_run();
        m.device = "Some GPU: \"X\"".into();
        assert!(builtin_for(&m.device).is_none());
        let spec = to_spec(&m, &slug(&m.device), None).unwrap();
        assert_eq!(spec.name, "some-gpu-x");
        assert_eq!(spec.arch, "hopper");
        let y = profile_yaml(&m, &spec, None).unwrap();
        let back = config::parse_gpu(&y, "p.yaml").unwrap();
        assert_eq!(back.model, "Some GPU: \"X\"");
        assert_eq!(back.vector_tflops.len(), 1);
        assert_eq!(back.matrix_tflops.len(), 4);
    }

    #[test]
    fn a_bad_measurement_is_refused_by_the_loader() {
        let mut m = h200_run();
        m.copy_gbps = f64::NAN;
        let spec = to_spec(&m, "x", None).unwrap();
        let e = profile_yaml(&m, &spec, None).unwrap_err().to_string();
        assert_eq!(
            e,
            "x.yaml: the copy bandwidth measurement is NaN, not a positive number"
        );
    }
}
