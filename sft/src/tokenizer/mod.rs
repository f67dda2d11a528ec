//! [`HfTokenizer`]: a Hugging Face tokenizer read from a model directory with the `tokenizers`
//! crate (the library behind the Python one), its named special tokens and its chat template.
//!
//! `tokenizer.json` is used as it is, as transformers 5 uses it for `TokenizersBackend`
//! (`PreTrainedTokenizerFast`). For a tokenizer class with its own `__init__` (`LlamaTokenizer`,
//! `Qwen2Tokenizer`, ...) transformers 5 rebuilds the normalizer, pre-tokenizer and decoder
//! from the class; a Hub file whose pipeline disagrees with its class would tokenize
//! differently here (the fixtures' files agree with their classes, see the README).
//! Special-token strings inside ordinary text are matched as the special tokens, as in Python.

mod chat;
mod config;
pub mod fast;
mod special;

use std::path::{Path, PathBuf};

use std::sync::Arc;

use tokenizers::Tokenizer;

use fast::{Caching, FastEncoder};

pub use chat::ChatEncoded;
pub use config::{SPECIAL_NAMES, TOKENIZER_FILES, TokenizerConfig};
pub use fast::Unsupported;
pub use special::{SpecialToken, SpecialTokens, token_text};

use crate::error::SftError;
use crate::hash::Fingerprint;
use crate::template::ChatTemplate;

/// Whether encoding adds the special tokens of the post-processor (BOS for Llama-style
/// tokenizers): Python's `add_special_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddSpecial {
    /// `tokenizer(text)`: the post-processor's tokens are added.
    Yes,
    /// `tokenizer(text, add_special_tokens=False)`.
    No,
}

impl AddSpecial {
    fn flag(self) -> bool {
        self == AddSpecial::Yes
    }
}

/// Which encoder [`HfTokenizer::encode`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodePath {
    /// The fast encoder ([`fast`]) when the tokenizer's shape is supported, else the crate.
    Fastest,
    /// The fast encoder without its per-thread word cache (every piece from the BPE model:
    /// for comparisons).
    FastUncached,
    /// Always the `tokenizers` crate (the oracle; for comparisons).
    Crate,
}

/// The ids of a text and, when asked for, each token's byte span in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// Token ids.
    pub ids: Vec<u32>,
    /// `(start, end)` byte offsets of each token in the text (empty when not asked for).
    pub offsets: Vec<(usize, usize)>,
}

impl Encoded {
    /// The token covering byte `position` of the text (`char_to_token`), if any: the first
    /// token whose span contains it.
    pub fn token_at(&self, position: usize) -> Option<usize> {
        self.offsets
            .iter()
            .position(|&(start, end)| start <= position && position < end)
    }
}

/// A tokenizer, its special tokens and its chat template.
#[derive(Debug, Clone)]
pub struct HfTokenizer {
    inner: Tokenizer,
    fast: Result<Arc<FastEncoder>, Unsupported>,
    path: EncodePath,
    special: SpecialTokens,
    template: Option<ChatTemplate>,
    dir: PathBuf,
    files: Vec<PathBuf>,
    fingerprint: Fingerprint,
}

impl HfTokenizer {
    /// Reads the tokenizer of the directory `dir` (`tokenizer.json` and the files of
    /// [`TokenizerConfig`]).
    pub fn from_dir(dir: &Path) -> Result<Self, SftError> {
        let file = dir.join("tokenizer.json");
        let shown = file.display().to_string();
        if !file.is_file() {
            return Err(SftError::in_file(
                shown,
                "no such file: the model directory has no fast tokenizer",
            )
            .with_help(
                "pass --tokenizer DIR naming a directory with tokenizer.json (a slow-only \
                 tokenizer can be converted with `AutoTokenizer.from_pretrained(...).save_pretrained(DIR)`)",
            ));
        }
        let bytes = std::fs::read(&file).map_err(|e| SftError::in_file(&shown, e.to_string()))?;
        let inner = Tokenizer::from_bytes(&bytes).map_err(|e| {
            SftError::in_file(
                &shown,
                format!("is not a tokenizer the `tokenizers` crate reads: {e}"),
            )
        })?;
        let config = TokenizerConfig::read(dir)?;
        let mut fingerprint = Fingerprint::new();
        fingerprint.add(&bytes);
        let mut special = SpecialTokens::default();
        for (name, text) in &config.special_texts {
            fingerprint.add(name.as_bytes());
            let Some(text) = text else { continue };
            fingerprint.add(text.as_bytes());
            let id = inner.token_to_id(text).ok_or_else(|| {
                SftError::in_file(
                    dir.join("tokenizer_config.json").display().to_string(),
                    format!("`{name}` is {text:?}, which is not in the tokenizer's vocabulary"),
                )
            })?;
            let token = Some(SpecialToken {
                text: text.clone(),
                id,
            });
            match *name {
                "bos_token" => special.bos = token,
                "eos_token" => special.eos = token,
                "pad_token" => special.pad = token,
                _ => special.unk = token,
            }
        }
        let template =
            match &config.chat_template {
                Some((source, path)) => {
                    fingerprint.add(source.as_bytes());
                    Some(ChatTemplate::new(source).map_err(|e| {
                        SftError::in_file(path.display().to_string(), e.to_string())
                    })?)
                }
                None => None,
            };
        Ok(Self {
            fast: FastEncoder::new(&inner).map(Arc::new),
            path: EncodePath::Fastest,
            inner,
            special,
            template,
            dir: dir.to_path_buf(),
            files: config.files,
            fingerprint,
        })
    }

    /// The directory it was read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tokenizer files of the directory, to be copied next to a saved model.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// A hash of everything that decides token ids (`tokenizer.json`, the special tokens, the
    /// chat template): the key of the token caches.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The named special tokens.
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// The chat template, if the directory has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// `len(tokenizer)`: the vocabulary with its added tokens; every id is below it.
    pub fn len(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Whether the vocabulary is empty (never, for a tokenizer that loaded).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The id of a token's text, if it is in the vocabulary.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// The same tokenizer, encoding by `path`.
    pub fn with_path(mut self, path: EncodePath) -> Self {
        self.path = path;
        self
    }

    /// Whether [`encode`](Self::encode) takes the fast encoder: `Ok` when it does, else why not.
    pub fn fast_path(&self) -> Result<(), Unsupported> {
        match (&self.fast, self.path) {
            (Ok(_), EncodePath::Fastest | EncodePath::FastUncached) => Ok(()),
            (Ok(_), EncodePath::Crate) => Err(Unsupported {
                reason: "the crate's path was asked for".into(),
            }),
            (Err(why), _) => Err(why.clone()),
        }
    }

    /// The fast encoder and its caching, when [`encode`](Self::encode) takes it.
    fn fast_encoder(&self) -> Option<(&FastEncoder, Caching)> {
        match (&self.fast, self.path) {
            (Ok(fast), EncodePath::Fastest) => Some((fast, Caching::PerThread)),
            (Ok(fast), EncodePath::FastUncached) => Some((fast, Caching::Off)),
            _ => None,
        }
    }

    /// Whether [`encode_with_offsets`](Self::encode_with_offsets) takes the fast encoder
    /// (a Metaspace tokenizer on the fast path).
    pub fn fast_offsets(&self) -> bool {
        self.fast_encoder()
            .is_some_and(|(fast, _)| fast.gives_offsets())
    }

    /// The ids of `text` (no offsets): from the fast encoder when it takes this tokenizer (the
    /// same ids), else from the crate.
    pub fn encode(&self, text: &str, special: AddSpecial) -> Result<Vec<u32>, String> {
        match self.fast_encoder() {
            Some((fast, caching)) => fast.encode(&self.inner, text, special, caching),
            None => self.encode_by_crate(text, special),
        }
    }

    /// The ids of `text` from the `tokenizers` crate, whatever the path.
    pub fn encode_by_crate(&self, text: &str, special: AddSpecial) -> Result<Vec<u32>, String> {
        self.inner
            .encode_fast(text, special.flag())
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// The ids of `text` and each token's byte span: from the fast encoder when it takes this
    /// tokenizer and gives offsets (Metaspace tokenizers; the same ids and spans), else from
    /// the crate.
    pub fn encode_with_offsets(&self, text: &str, special: AddSpecial) -> Result<Encoded, String> {
        if let Some((fast, caching)) = self.fast_encoder()
            && let Some((ids, offsets)) =
                fast.encode_with_offsets(&self.inner, text, special, caching)?
        {
            return Ok(Encoded { ids, offsets });
        }
        self.encode_with_offsets_by_crate(text, special)
    }

    /// The ids of `text` and each token's byte span from the `tokenizers` crate, whatever the
    /// path.
    pub fn encode_with_offsets_by_crate(
        &self,
        text: &str,
        special: AddSpecial,
    ) -> Result<Encoded, String> {
        let encoding = self
            .inner
            .encode(text, special.flag())
            .map_err(|e| e.to_string())?;
        Ok(Encoded {
            ids: encoding.get_ids().to_vec(),
            offsets: encoding.get_offsets().to_vec(),
        })
    }

    /// The text of `ids` (special tokens kept), for messages and checks.
    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.inner.decode(ids, false).map_err(|e| e.to_string())
    }
}
