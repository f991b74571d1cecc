//! Python helpers the PyTorch and Horovod modules both append: autocast, the GradScaler,
//! fused-Adam keyword arguments, accumulation windows. A module of its own so that neither
//! emitter imports the other.

/// Helpers the PyTorch and Horovod modules share (they read `DTYPE`, `GRAD_ACCUMULATION` and
/// `FUSED_ADAM`): autocast, the GradScaler, fused-Adam keyword arguments, accumulation windows.
pub(super) const TORCH_HELPERS_PY: &str = r#"

# The device type autocast and the GradScaler use: the model's, once apply_plan (or
# set_device_type) has seen it; before that CUDA when available, else the CPU.
DEVICE_TYPE = None


def set_device_type(model_or_device):
    """Make autocast_context() and make_grad_scaler() default to the device type of a model
    (its first parameter), a torch.device or a string such as "cpu"."""
    global DEVICE_TYPE
    d = model_or_device
    if hasattr(d, "parameters"):
        p = next(iter(d.parameters()), None)
        d = p.device if p is not None else None
    if d is not None:
        DEVICE_TYPE = getattr(d, "type", None) or str(d).split(":")[0]
    return DEVICE_TYPE


def _device_type(device_type):
    if device_type is not None:
        return device_type
    if DEVICE_TYPE is not None:
        return DEVICE_TYPE
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def autocast_context(device_type=None):
    """`torch.autocast` in the planned dtype on `device_type` (default: the model's device, see
    set_device_type), or a no-op context without AMP. Autocast on a device the model is not on
    would silently leave it in fp32."""
    if DTYPE == "fp32":
        return contextlib.nullcontext()
    import torch

    dtype = torch.float16 if DTYPE == "fp16" else torch.bfloat16
    return torch.autocast(_device_type(device_type), dtype=dtype)


def make_grad_scaler(device_type=None):
    """A GradScaler, enabled for fp16 (bf16 and fp32 need none: it is then a pass-through)."""
    import torch

    enabled = DTYPE == "fp16"
    device_type = _device_type(device_type)
    try:
        return torch.amp.GradScaler(device_type, enabled=enabled)
    except (AttributeError, TypeError):
        return torch.cuda.amp.GradScaler(enabled=enabled)


def optimizer_kwargs():
    """Extra keyword arguments for torch.optim.Adam / AdamW that the plan asks for:
    {"fused": True} when it planned fused Adam, else {}."""
    return {"fused": True} if FUSED_ADAM else {}


def is_update_step(step):
    """True on the micro-step that ends an accumulation window (always without accumulation)."""
    return (step + 1) % GRAD_ACCUMULATION == 0


def scale_loss(loss):
    """The micro-step's loss divided by GRAD_ACCUMULATION, so the accumulated gradient is the
    mean over the whole batch (the loss as is without accumulation)."""
    return loss / GRAD_ACCUMULATION if GRAD_ACCUMULATION > 1 else loss
"#;
