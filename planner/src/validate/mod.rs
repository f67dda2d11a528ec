//! `dsplan validate`: schema checks and DeepSpeed's semantic rules, all problems at once.
