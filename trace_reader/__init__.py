"""Read a torch.profiler trace back; inspect_trace.py is the command, these files are the parts.

Which file answers which question:

    read.py      How is a trace file read? Event, Kernel, Step, Trace; load_trace / parse_trace: JSON or
                 gzip (capped: a trace is untrusted input), the CPU call tree, which op launched which
                 kernel, which step each belongs to; the kernel sources a trace names, only on request.
    fast_json.py How is a trace decoded fast? msgspec (where installed) decodes the events straight into
                 structs, only the fields the reader uses, each event's args when first asked for; read.py
                 falls back to the stdlib's json for anything it refuses.
    kernels.py   What is this kernel or op? GEMM or pointwise, its FLOPs and bytes, its dtype, a short
                 name, the CPU's "kernels" (each op that computes, once) thread by thread, a step's units
                 of work in launch order.
    peaks.py     What could this device do? Datasheet TFLOP/s and GB/s: torch's table, then ours.
    report.py    What does one trace say? report_data() (the report as data, --json) and report(); each
                 step's verdict and the typical step's (bound_of), launch-to-start lag, why the GPU idles,
                 gpu_time_by_annotation(), cpu_time_by_annotation(), cpu_self_times().
    compiled.py  What did torch.compile run? Its compiled regions per step: frames, graph breaks, recompiles.
    align.py     Which kernels stayed? An exact longest common subsequence of two launch orders, any length.
    compare.py   What changed between two traces? Kept, gone, new kernels (calls per step, time per call),
                 which replaced which (paired by what they do), CPU ops, each call counted once;
                 comparison_data() for --json.
    lag.py       How far behind is the GPU? Per step: launch-to-GPU-start lag, record_function-to-first-op gap.
    plot.py      What does it look like? The roofline of one or two traces, a benchmark's bars against its
                 floor (matplotlib, imported only when drawing).
    expect.py    Was the guess right? Expect and its builders (steps(), kernel(), ...), check(),
                 print_expectations(); expectations_for(): a script's guesses for a saved trace (--expect).
    declared.py  Were your own guesses right? Expectations declared in a TOML file (--expect FILE), each one built
                 on the builders and analyzers here; one line naming the file and the table for any mistake in it.
    memory.py    What did a step allocate, how fast did it stream memory? Per-step peak allocation from
                 the "[memory]" events (profile_memory=True); allocates() and streams() expectations.
    training.py  Where does a training step's time go? Forward, backward, optimizer per step (07's annotations,
                 or torch.optim's and autograd's own spans), backward's GEMM FLOPs over forward's, the optimizer's
                 ops and kernels, the slowest backward ops with their forward op (fwdbwd flows); expectations.
    passes.py    How is a training step cut into phases? A forward and a backward pass per micro-batch (torch's own
                 spans, or 07's and 09's annotations), DDP's and FSDP's tails in backward, compiler work cut out,
                 the communication wait inside backward.
    memory_timeline.py  Where does the memory go, by category? torch's memory timeline read back, each
                 category's peak, the stacked picture (07_train_step.py --memory).
    collectives.py  What did one rank's step call, and what ran it? c10d's calls paired with gloo's spans or
                 NCCL's kernels, each call's wait; the step's compute and communication, cut to the step.
    ranks.py     Where did each rank's time go? The traces of one distributed run joined by rank (distributedInfo;
                 not one run, or two runs' ranks: one line), per rank and step busy, compute, communication
                 overlapped and exposed, wait; per collective the arrivals (the calls), skew, straggler or tie,
                 the transfer's time, size, algbw and busbw; 08_tensor_parallel's expectations.
    data_parallel.py  Where do a data-parallel step's collectives fall? The collectives each rank called (c10d's ops)
                 placed in its micro-batches' forward and backward, DDP's buckets, FSDP2's all-gathers and
                 reduce-scatters, the straggler and who waits for it; 09_data_parallel's expectations.
    intervals.py How much time do these intervals cover, together or in common? merge, length, common,
                 intersection, gaps.
    modules.py   Where does a model's time go? Annotations named by module path (model.layers.3.mlp) per
                 module type and per decoder layer: GPU time, kernels, CPU time (06_model.py).
"""
