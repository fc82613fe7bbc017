"""Read a torch.profiler trace back; inspect_trace.py is the command, these files are the parts.

Which file answers which question:

    read.py      How is a trace file read? Event, Kernel, Step, Trace; load_trace / parse_trace: JSON or
                 gzip, the CPU call tree, which op launched which kernel, which step each belongs to.
    kernels.py   What is this kernel or op? GEMM or pointwise, its FLOPs and bytes, its dtype, a short
                 name, the CPU's "kernels", a step's units of work in launch order.
    peaks.py     What could this device do? Datasheet TFLOP/s and GB/s: torch's table, then ours.
    report.py    What does one trace say? The one-trace report; overhead- or compute-bound (bound_of).
    compare.py   What changed between two traces? Same, gone, new kernels (calls per step, time per call),
                 which replaced which (paired by what they do), CPU ops; comparison_data() for --json.
    expect.py    Was the guess right? Expect and its builders (steps(), kernel(), ...), check(),
                 print_expectations().
"""
