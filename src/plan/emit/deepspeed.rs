//! DeepSpeed: `ds_config.json`. (Being written: issue 23.)

use super::{EmitError, Emitted, Facts};
use crate::plan::Plan;

pub(super) fn emit(_plan: &Plan, _f: &Facts) -> Result<Emitted, EmitError> {
    Err(EmitError::Inconsistent(
        "this export is not written yet (issue 23)".into(),
    ))
}
