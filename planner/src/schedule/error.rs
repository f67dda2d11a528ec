//! What can go wrong when a scheduler is built from `scheduler.params`, as data.
//!
//! Every refusal names the parameter at fault and carries a message equivalent to the exception
//! DeepSpeed 0.19.8 raises (or, where DeepSpeed would only crash later, what it would crash on).

use crate::diagnostics::Code;

/// Why a scheduler could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleErrorKind {
    /// `scheduler.type` names nothing DeepSpeed can build
    /// ("DeepSpeed does not recognize LR scheduler X").
    UnknownScheduler,
    /// `scheduler.type` names a `torch.optim.lr_scheduler` class: DeepSpeed builds it, dsplan
    /// does not model it.
    TorchScheduler,
    /// A key the scheduler's constructor does not take (Python's `TypeError: unexpected keyword`).
    UnknownParameter,
    /// A required constructor argument is absent.
    MissingParameter,
    /// A value of a type the constructor cannot use.
    WrongType,
    /// A value DeepSpeed's constructor checks and refuses (`ValueError`).
    InvalidValue,
    /// A per-parameter-group list whose length differs from the number of groups.
    GroupCountMismatch,
}

/// A scheduler DeepSpeed would refuse to build (or would crash on), with the parameter at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleError {
    /// What kind of problem.
    pub kind: ScheduleErrorKind,
    /// The `scheduler.params` key at fault; `None` when the problem is the scheduler type.
    pub param: Option<String>,
    /// The message, equivalent to DeepSpeed's own.
    pub message: String,
    /// A nearby valid name, for unknown names.
    pub suggestion: Option<String>,
}

impl ScheduleError {
    /// An error about one parameter.
    pub(crate) fn param(kind: ScheduleErrorKind, param: &str, message: impl Into<String>) -> Self {
        ScheduleError {
            kind,
            param: Some(param.to_string()),
            message: message.into(),
            suggestion: None,
        }
    }

    /// The diagnostic code a validator reports this error under.
    pub fn code(&self) -> Code {
        match self.kind {
            ScheduleErrorKind::UnknownScheduler | ScheduleErrorKind::TorchScheduler => {
                Code::UnknownScheduler
            }
            ScheduleErrorKind::UnknownParameter => Code::UnknownSchedulerParam,
            ScheduleErrorKind::MissingParameter => Code::MissingKey,
            ScheduleErrorKind::WrongType => Code::WrongType,
            ScheduleErrorKind::InvalidValue | ScheduleErrorKind::GroupCountMismatch => {
                Code::OutOfRange
            }
        }
    }
}

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let Some(suggestion) = &self.suggestion {
            write!(f, " (did you mean `{suggestion}`?)")?;
        }
        Ok(())
    }
}

impl std::error::Error for ScheduleError {}

/// Something DeepSpeed accepts but logs a warning about (or that only one loader accepts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleWarning {
    /// The `scheduler.params` key concerned, if one.
    pub param: Option<String>,
    /// What DeepSpeed logs, or why the value is suspicious.
    pub message: String,
}

impl ScheduleWarning {
    /// A warning about one parameter.
    pub(crate) fn param(param: &str, message: impl Into<String>) -> Self {
        ScheduleWarning {
            param: Some(param.to_string()),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ScheduleWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
