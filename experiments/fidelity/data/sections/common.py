def micro_step(mb, gpus, v):
    """(iteration_ms, note) for a row whose accumulation during the benchmark is unknown."""
    return (round(mb * gpus / v * 1000.0, 2),
            "iteration_ms derived per forward+backward micro-step = micro_batch x gpus / "
            "throughput x 1000 (accumulation during the benchmark not stated)")
