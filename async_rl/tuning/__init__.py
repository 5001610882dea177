"""Throughput tuning: profile the real pieces, simulate the pipeline, recommend a deployment (``tools/tune.py``).

``simulator`` is a pure discrete-event model of actors, coordinator admission, learner steps and weight broadcasts;
``profile`` holds the measured rates (JSON) and runs the probes; ``recommend`` searches deployments with the
simulator; ``validate`` compares its predictions with real runs on this machine.
"""
