"""The timing the PyTorch peers share (bench/*_torch.py), as parity's benchmarks time theirs: the
median of calls each bracketed by CUDA events, after warm-up calls."""
import statistics
import time


def median_ms(fn, warmup, reps, wall=False):
    """Median milliseconds of fn(i) over reps calls after warmup calls. wall: the host's clock
    around each call instead (a smoke test on the CPU, not a measurement)."""
    for i in range(warmup):
        fn(i)
    if wall:
        times = []
        for i in range(reps):
            t0 = time.perf_counter()
            fn(warmup + i)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    import torch
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(warmup + i)
        stops[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, stops))
