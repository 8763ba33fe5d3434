"""The recipe plane: training and rollout on the serving loops.

Everything here is a client of the core: the models are the serving models (built by the
serving loaders, switched to the train profile with grad on), the schedules are the serving
schedules, and rollouts run the serving loops through an engine's scheduler and executors with
a read-only behavior observer. Nothing in the runtime imports this package.

    data.py        the procedural shapes dataset ("procedural shapes v1")
    flow.py        the flow-matching objective on the serve-time sigma family
    vae.py         stage 1: the tiny VAE
    trainer.py     stage 2: DiT + text encoder, jointly
    rollout.py     Rollout / BehaviorCapture / BehaviorRecord (serving loop + capture)
    distill.py     stage 3: the 4-step student from teacher rollouts (reflow)
    checkpoint.py  shipped safetensors files, EMA

``bench/train_tiny.py`` runs the three stages; ``bench/quality.py`` measures adherence.
"""
