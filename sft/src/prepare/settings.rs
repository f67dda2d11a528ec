//! [`PrepareSettings`]: the `SFTConfig` fields that decide how rows become token ids and
//! labels, with TRL 1.16's defaults.

/// Which prompt-completion tokens carry a label (`completion_only_loss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CompletionLoss {
    /// `None`, TRL's default: completion-only for prompt-completion rows.
    #[default]
    Default,
    /// `True`: the prompt's tokens get -100.
    CompletionOnly,
    /// `False`: every token is labelled.
    AllTokens,
}

/// Which tokens of a conversation carry a label (`assistant_only_loss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AssistantLoss {
    /// `False`, TRL's default: the whole rendered conversation.
    #[default]
    WholeConversation,
    /// `True`: only the template's `{% generation %}` spans.
    AssistantOnly,
}

/// What happens to a row longer than `max_length` (non-packed runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OverLength {
    /// `truncation_mode="keep_start"`: the first `max_length` tokens are kept.
    #[default]
    KeepStart,
    /// The row is a bad row: an error naming it (or a counted skip).
    Refuse,
}

/// Whether rows are packed (`packing` / `packing_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Packing {
    /// `packing=False`, TRL's default: one row per example, right-padded by the collator.
    #[default]
    Off,
    /// `packing=True, packing_strategy="bfd"`: best-fit decreasing, padding-free batches.
    Bfd,
}

/// The settings of the preparation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrepareSettings {
    /// `max_length` (TRL's default 1024); `None` is no limit.
    pub max_length: Option<usize>,
    /// Rows over `max_length` in non-packed runs.
    pub over_length: OverLength,
    /// `completion_only_loss`.
    pub completion_loss: CompletionLoss,
    /// `assistant_only_loss`.
    pub assistant_loss: AssistantLoss,
    /// `packing`.
    pub packing: Packing,
}

impl Default for PrepareSettings {
    fn default() -> Self {
        Self {
            max_length: Some(1024),
            over_length: OverLength::KeepStart,
            completion_loss: CompletionLoss::Default,
            assistant_loss: AssistantLoss::WholeConversation,
            packing: Packing::Off,
        }
    }
}

impl PrepareSettings {
    /// Whether prompt tokens get -100.
    pub fn masks_prompt(&self) -> bool {
        self.completion_loss != CompletionLoss::AllTokens
    }

    /// A stable text of every field, for the cache's fingerprint.
    pub fn key(&self) -> String {
        format!("{self:?}")
    }
}
