"""Discrete-event simulator: the live run's schedule, policies and step model, played in virtual time.

    simulator.engine.Simulation(policy, model, hellos, schedule_frame, settings=...).run() -> RunStore
    simulator.run.simulate(cfg, schedule) -> collector.tables.Tables        (nothing written)
    simulator.run.simulate_run(cfg, schedule=None) -> summary              (writes cfg.out like a live run)
    simulator.sweep.plan_simulation(config, overrides) / run_simulation(plan)   (`batchlab simulate`)
"""
