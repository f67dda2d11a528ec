//! Diagnostics as data.
//!
//! Every check in dsplan (parsing, schema validation, semantic rules, resolution, planning)
//! reports problems as [`Diagnostic`] values instead of printing them. A diagnostic names a
//! stable [`Code`], a [`Severity`], the JSON pointer of the offending value and, once located
//! against the source text, its line and column. Renderers (human, JSON) live elsewhere; the
//! library never prints.

use serde::Serialize;

/// How bad a diagnostic is. `Error` makes a file invalid; `--strict` promotes warnings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The config is wrong: DeepSpeed would reject it, or it would silently do something else.
    Error,
    /// Probably a mistake, or accepted by one loader and rejected by another.
    Warning,
    /// Worth knowing; nothing to fix (for example an `"auto"` value awaiting resolution).
    Info,
}

impl Severity {
    /// The lowercase name used in both renderers.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// Declares [`Code`] with its stable name and the list of all codes in one place.
macro_rules! codes {
    ($( $(#[doc = $doc:literal])* $variant:ident => $name:literal, )*) => {
        /// Stable, kebab-case identifiers of every diagnostic dsplan emits. The README documents
        /// each; a test checks that each one is produced by at least one small config.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl Code {
            /// Every code, in declaration order.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The stable kebab-case name, as in `--format json`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( Code::$variant => $name, )*
                }
            }
        }
    };
}

codes! {
    /// The file could not be read at all.
    UnreadableFile => "unreadable-file",
    /// The file is empty or holds only whitespace and comments.
    EmptyFile => "empty-file",
    /// The bytes are not valid UTF-8.
    NotUtf8 => "not-utf8",
    /// The text is not JSON (even with comments and trailing commas allowed).
    SyntaxError => "syntax-error",
    /// Nesting deeper than dsplan is willing to follow.
    TooDeep => "too-deep",
    /// A number that does not fit in a 64-bit float (e.g. `1e400`).
    NumberOutOfRange => "number-out-of-range",
    /// The top-level value is not an object.
    RootNotObject => "root-not-object",
    /// The same key appears twice in one object (DeepSpeed raises on this).
    DuplicateKey => "duplicate-key",
    /// Comments or trailing commas: DeepSpeed's loader accepts them, Hugging Face's does not.
    NonStrictJson => "non-strict-json",
    /// A key that DeepSpeed does not know inside a section, or a near miss at the top level.
    UnknownKey => "unknown-key",
    /// A top-level key unrelated to any DeepSpeed key (DeepSpeed ignores it).
    UnusedTopLevelKey => "unused-top-level-key",
    /// A value of the wrong JSON type.
    WrongType => "wrong-type",
    /// An integer field holding a number with a fractional part.
    NonIntegral => "non-integral",
    /// A number outside the allowed range.
    OutOfRange => "out-of-range",
    /// A string or number that is not one of the allowed values.
    InvalidEnumValue => "invalid-enum-value",
    /// `"auto"` where nothing (neither Hugging Face nor dsplan) can fill it.
    AutoNotAllowed => "auto-not-allowed",
    /// `optimizer.type` is not an optimizer DeepSpeed can build.
    UnknownOptimizer => "unknown-optimizer",
    /// `optimizer.params` has a key the optimizer's constructor does not take.
    UnknownOptimizerParam => "unknown-optimizer-param",
    /// `scheduler.type` is not a DeepSpeed (or torch) LR scheduler.
    UnknownScheduler => "unknown-scheduler",
    /// `scheduler.params` has a key the scheduler's constructor does not take.
    UnknownSchedulerParam => "unknown-scheduler-param",
    /// A required key is missing.
    MissingKey => "missing-key",
    /// `"auto"` that `dsplan resolve` (or the Hugging Face Trainer) fills.
    NeedsResolution => "needs-resolution",
    /// The batch-size triangle does not add up for the given world size.
    BatchSizeMismatch => "batch-size-mismatch",
    /// Neither `train_batch_size` nor `train_micro_batch_size_per_gpu` is given.
    BatchSizeMissing => "batch-size-missing",
    /// A batch quantity that must be at least 1 is not.
    BatchSizeNotPositive => "batch-size-not-positive",
    /// fp16 and bf16 are both enabled.
    ConflictingPrecision => "conflicting-precision",
    /// A setting that has no effect at the configured ZeRO stage.
    IneffectiveAtStage => "ineffective-at-stage",
    /// NVMe offload without an `nvme_path`.
    NvmeWithoutPath => "nvme-without-path",
    /// A feature DeepSpeed 0.19.8 removed; DeepSpeed rejects the file.
    RemovedFeature => "removed-feature",
    /// A deprecated spelling that still works.
    DeprecatedKey => "deprecated-key",
    /// A deprecated key and its replacement given together (DeepSpeed asserts).
    DeprecatedAndReplacement => "deprecated-and-replacement",
    /// ZeRO-3 without `gather_16bit_weights_on_model_save`: a saved model will be empty.
    EmptyModelSave => "empty-model-save",
    /// Two settings that DeepSpeed refuses to combine.
    IncompatibleSettings => "incompatible-settings",
    /// An explicit value disagrees with a training argument.
    AutoMismatch => "auto-mismatch",
    /// An `"auto"` that nothing given can fill.
    UnresolvableAuto => "unresolvable-auto",
    /// A numeric string normalised to a number.
    NormalisedString => "normalised-string",
    /// A setting nothing reads in this configuration (e.g. a dynamic loss-scale knob next to a
    /// static `loss_scale`).
    IgnoredSetting => "ignored-setting",
    /// A key given under two spellings (an alias and its canonical name) with different values.
    ConflictingSpellings => "conflicting-spellings",
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem found in one file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnostic {
    /// How bad it is.
    pub severity: Severity,
    /// Stable identifier.
    pub code: Code,
    /// JSON pointer (RFC 6901) of the offending value; `""` for the whole document.
    pub pointer: String,
    /// 1-based line of the offending key or value, once located.
    pub line: Option<usize>,
    /// 1-based column (in characters), once located.
    pub column: Option<usize>,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<String>,
}

impl Diagnostic {
    /// A diagnostic not yet located in the source text.
    pub fn new(
        severity: Severity,
        code: Code,
        pointer: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Diagnostic {
            severity,
            code,
            pointer: pointer.into(),
            line: None,
            column: None,
            message: message.into(),
            help: None,
        }
    }

    /// Shorthand for an error.
    pub fn error(code: Code, pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Severity::Error, code, pointer, message)
    }

    /// Shorthand for a warning.
    pub fn warning(code: Code, pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Severity::Warning, code, pointer, message)
    }

    /// Shorthand for an info.
    pub fn info(code: Code, pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Severity::Info, code, pointer, message)
    }

    /// Attach a fix.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Attach a 1-based line and column.
    pub fn at(mut self, line: usize, column: usize) -> Self {
        self.line = Some(line);
        self.column = Some(column);
        self
    }

    /// Whether this diagnostic makes the file invalid.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}
