//! The GPT-2 shapes the CUDA host tests build their steps from: GPT-2 124M, and tiny-gpt2
//! widened to head size 64 (n_embd 128, 2 heads), the smallest model the attention kernels take.

#![allow(dead_code)]

use dsplan_executor::model::Gpt2Config;
use dsplan_executor::train::choose_model;

/// GPT-2 124M (the `gpt2` preset).
pub fn gpt2() -> Gpt2Config {
    choose_model(Some("gpt2"), 1)
        .expect("gpt2 preset")
        .config
        .gpt2()
        .copied()
        .expect("a GPT-2")
}

/// tiny-gpt2 widened to head size 64 (n_embd 128, 2 heads).
pub fn small_head_64() -> Gpt2Config {
    Gpt2Config {
        n_embd: 128,
        n_head: 2,
        ..choose_model(None, 1)
            .expect("tiny")
            .config
            .gpt2()
            .copied()
            .expect("a GPT-2")
    }
}
