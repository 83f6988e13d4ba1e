"""Discrete-event simulator: the live run's schedule, policies and step model, played in virtual time.

    simulator.run.Simulation(policy, model, hellos, schedule_frame, settings=...).run() -> RunStore
    simulator.run.simulate(cfg, schedule) -> collector.tables.Tables        (nothing written)
    simulator.fidelity.add_run_fidelity(run_dir) -> a live sim/echo run's timing fidelity (post-processing)

The front end composes files and grids from these: lab.simulate.simulate_run(cfg) writes cfg.out like a
live run, lab.simulate plans and plays `batchlab simulate`'s grid.
"""
