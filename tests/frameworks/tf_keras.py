"""Run an exported trainplan_xla.py against real TensorFlow / Keras, on CPU.

    python tf_keras.py EXPORT_DIR

Prints one JSON line with what it saw (tests/it/frameworks.rs asserts on it):
* precision: after set_precision_policy(), `tf.keras.applications.ResNet50(weights=None)` computes
  in the planned dtype with fp32 variables, and check_model accepts it (a model built before the
  policy is refused when the plan is mixed);
* compile: model.compile(**compile_kwargs()) runs XLA exactly when the plan does
  (`model.jit_compile`), and under fp16 Keras wraps the optimizer in a LossScaleOptimizer;
* accumulation: the optimizer from make_optimizer updates the weights on every
  GRAD_ACCUMULATION-th micro-step only (a small model compiled the same way, two updates;
  ResNet-50: at least one, on k-th micro-steps only — fp16 may skip an overflowed step), and k
  micro-batches give the same weights as one step on the whole batch;
* what a zoo plan cannot target: none of UNTARGETED_LAYERS (the plan's fused / recomputed layer
  names) is a layer of the Keras ResNet-50, so NOT_APPLIED tells the truth.
Inputs are 64x64 images (at 32x32 the last stage is 1x1 and fp16 batch norm over 2 samples
overflows) and micro-batches of at most 2 samples, to keep the run short.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import keras


def weights_of(model):
    return [w.numpy().copy() for w in model.trainable_weights]


def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def main():
    export_dir = sys.argv[1]
    sys.path.insert(0, export_dir)
    import trainplan_xla as tp

    seen = {"tensorflow": tf.__version__, "keras": keras.__version__}
    seen["policy"] = tp.PRECISION_POLICY
    seen["jit_compile_planned"] = tp.JIT_COMPILE
    seen["k"] = tp.GRAD_ACCUMULATION
    seen["not_applied"] = tp.NOT_APPLIED

    # A model built before the policy is refused when the plan is mixed.
    keras.mixed_precision.set_global_policy("float32")
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    try:
        tp.check_model(plain)
        seen["unplanned_model_refused"] = False
    except ValueError:
        seen["unplanned_model_refused"] = True

    tp.set_precision_policy()
    model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
    tp.check_model(model)
    conv = model.get_layer("conv1_conv")
    seen["compute_dtype"] = conv.compute_dtype
    seen["variable_dtype"] = conv.variable_dtype
    keras_names = {layer.name for layer in model.layers}
    seen["untargeted_layers"] = len(tp.UNTARGETED_LAYERS)
    seen["untargeted_in_keras"] = sorted(set(tp.UNTARGETED_LAYERS) & keras_names)

    opt = tp.make_optimizer(keras.optimizers.SGD, learning_rate=0.01)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", **tp.compile_kwargs())
    seen["jit_compile"] = bool(model.jit_compile)
    seen["loss_scale_optimizer"] = isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    inner = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    seen["gradient_accumulation_steps"] = inner.gradient_accumulation_steps
    if seen["loss_scale_optimizer"]:
        # A fresh fp16 loss scale (2**15) overflows on a randomly initialised ResNet-50 and
        # skips the first steps, as it should; start at 1 so that some steps are finite (set
        # before the optimizer is built on the first step).
        model.optimizer.initial_scale = 1.0
    micro = max(1, min(2, int(tp.MICRO_BATCH or 2)))
    rng = np.random.default_rng(0)

    def cadence(model, make_batch, steps):
        changed = []
        before = weights_of(model)
        for _ in range(steps):
            x, y = make_batch()
            model.train_on_batch(x, y)
            after = weights_of(model)
            changed.append(not same(before, after))
            before = after
        return changed

    # ResNet-50 trains under the plan; in fp16 a step whose gradients overflow is skipped by
    # the loss scaler, so only "updates on k-th micro-steps, at least one" is checked here.
    seen["resnet_changed"] = cadence(
        model,
        lambda: (rng.random((micro, 64, 64, 3), dtype=np.float32), rng.integers(0, 10, size=(micro,))),
        2 * tp.GRAD_ACCUMULATION,
    )

    # The exact cadence on a small model built and compiled the same way (finite in fp16): the
    # weights change on every k-th micro-step, never in between.
    keras.utils.set_random_seed(2)
    small_model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(3, dtype="float32")])
    small_model.compile(
        optimizer=tp.make_optimizer(keras.optimizers.SGD, learning_rate=0.1), loss="mse", **tp.compile_kwargs()
    )
    if seen["loss_scale_optimizer"]:
        small_model.optimizer.initial_scale = 1.0
    seen["small_compute_dtype"] = small_model.layers[0].compute_dtype
    seen["changed_at_micro_step"] = cadence(
        small_model,
        lambda: (rng.random((micro, 4), dtype=np.float32), rng.random((micro, 3), dtype=np.float32)),
        2 * tp.GRAD_ACCUMULATION,
    )
    inner = getattr(small_model.optimizer, "inner_optimizer", small_model.optimizer)
    seen["optimizer_updates"] = int(inner.iterations.numpy())

    # Accumulation arithmetic on a small Dense model, in fp32: k micro-batches through
    # make_optimizer equal one SGD step on the whole batch (Keras averages the k gradients).
    keras.mixed_precision.set_global_policy("float32")
    k = tp.GRAD_ACCUMULATION
    x = rng.random((2 * k, 4), dtype=np.float32)
    y = rng.random((2 * k, 3), dtype=np.float32)

    def small():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])

    acc = small()
    acc.compile(optimizer=tp.make_optimizer(keras.optimizers.SGD, learning_rate=0.5), loss="mse")
    for part_x, part_y in zip(np.split(x, k), np.split(y, k)):
        acc.train_on_batch(part_x, part_y)
    whole = small()
    whole.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5), loss="mse")
    whole.train_on_batch(x, y)
    seen["accumulated_weight_error"] = float(
        max(np.max(np.abs(a - b)) for a, b in zip(weights_of(acc), weights_of(whole)))
    )
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
