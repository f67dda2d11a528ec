//! Math shared by the planner and the executor: learning-rate schedules and the fp16
//! loss-scale state machine, exactly as DeepSpeed 0.19.8 computes them.
