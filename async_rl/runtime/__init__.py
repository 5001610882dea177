"""Wiring of the pieces into processes: what the learner and actor processes build from a Config, and their loops.

``resources``   config -> model path, tokenized prompt records
``metrics``     per-step metrics sinks (JSON lines, TensorBoard, console) and the end-of-run plot
``learner_main`` the learner process (every torchrun rank; rank 0 also runs the coordinator)
``actor_main``  an actor process (one vLLM engine)
``parent_watch`` a process (rank, actor, reward worker) exits when its parent dies: no orphans
``graceful_stop`` SIGTERM on a learner rank: stop at a step boundary, checkpoint, exit within a deadline
"""
