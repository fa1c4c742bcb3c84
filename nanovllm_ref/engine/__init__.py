"""Engine internals: sequences, block manager, scheduler (pure Python), model runner, workers, engine loop."""
