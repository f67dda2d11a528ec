//! [`LossNormalisation`]: how a step's micro-batch losses are normalised, DeepSpeed's way or
//! the Hugging Face Trainer's.

/// How each micro-batch's loss is divided, and so how the step's gradient and logged loss are
/// formed (`G` micro-batches per rank, `W` ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossNormalisation {
    /// DeepSpeed's engine with a plain model: each micro-batch's loss is its own token mean,
    /// its backward is scaled by `1 / G` (`scale_wrt_gas`), the gradients are averaged over
    /// ranks; the logged loss is the mean of the micro-batch means over micro-batches and
    /// ranks. Every token source trains this way.
    #[default]
    MicroBatchMean,
    /// The Hugging Face Trainer (transformers 5, TRL 1.16) under DeepSpeed: before the step,
    /// `num_items_in_batch` = the label tokens (`labels[..., 1:] != -100`) of all `G`
    /// micro-batches of every rank; each micro-batch's loss is its summed NLL over
    /// `num_items_in_batch`, times `W` when `W > 1` (the gradients are then averaged), with no
    /// `1 / G`; the logged loss is the sum of the micro-batch losses, averaged over ranks: the
    /// token mean of the whole step. SFT batches train this way.
    TokensInStep,
}
