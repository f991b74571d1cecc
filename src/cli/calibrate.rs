//! `trainplan calibrate [-o FILE]`: measure this machine's GPU and write a GPU profile
//! (`crate::calibrate`). Needs a build with `--features gpu`; without it, or without a GPU, it
//! says so and exits 3.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use super::CliError;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Where to write the GPU profile (YAML, the format of configs/gpus/); default: stdout.
    /// Use it with `--gpu FILE` (lower-bound) or `gpu: FILE` in a cluster file.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The profile's name (default: from the device name, e.g. nvidia-h200).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Which GPU to measure (CUDA device ordinal).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub device: usize,
}

/// `trainplan calibrate`.
#[cfg(feature = "gpu")]
pub fn calibrate_cmd(a: &CalibrateArgs) -> Result<(), CliError> {
    use crate::calibrate;
    let m = calibrate::cuda::calibrate(a.device).map_err(CliError::bad_input)?;
    let base = calibrate::builtin_for(&m.device);
    let name = a.name.clone().unwrap_or_else(|| calibrate::slug(&m.device));
    let spec = calibrate::to_spec(&m, &name, base.as_ref()).map_err(CliError::bad_input)?;
    let yaml = calibrate::profile_yaml(&m, &spec, base.as_ref()).map_err(CliError::internal)?;
    match &a.output {
        Some(p) => {
            super::distinct::check(&[super::distinct::Output::new("-o", p)], &[], &[])?;
            super::write_atomic(p, |w| w.write_all(yaml.as_bytes()))
                .map_err(|e| CliError::output(format!("{}: failed to write: {e}", p.display())))?;
            eprintln!("GPU profile written to {}", p.display());
            Ok(())
        }
        None => super::output::stdout()
            .write_all(yaml.as_bytes())
            .map_err(CliError::stdout),
    }
}

/// `trainplan calibrate` in a build without the `gpu` feature.
#[cfg(not(feature = "gpu"))]
pub fn calibrate_cmd(a: &CalibrateArgs) -> Result<(), CliError> {
    let _ = (&a.output, &a.name, a.device, std::io::stdout().flush());
    Err(CliError::bad_input(crate::calibrate::NO_GPU_FEATURE))
}
