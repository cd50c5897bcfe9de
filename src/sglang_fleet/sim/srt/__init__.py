"""SGLang 0.5.23's own frames, where the simulator's ranks do their work and hang.

Each module here is filed and named as the release's (srt/model_executor/runner/
decode_cuda_graph_runner.py, srt/distributed/parallel_state.py, ...) and each function as the
one it stands for, so that py-spy, run on a simulated rank, reads the frames it reads on a real
one and the gate's hang signatures (module_utils health/stacks.py) meet SGLang's own names.
The bodies are the simulator's: they wait, read or spin as the real code does when it
progresses or hangs.
"""
