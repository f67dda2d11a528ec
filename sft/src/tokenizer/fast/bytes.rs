//! GPT-2's byte-to-character map of the `ByteLevel` pre-tokenizer: each byte of a piece
//! becomes one printable character before the BPE model sees it.

/// The character of each byte.
#[derive(Debug, Clone)]
pub struct ByteChars([char; 256]);

impl ByteChars {
    /// GPT-2's table: the printable bytes (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) stand for
    /// themselves, the others, in byte order, for U+0100 onwards.
    pub fn new() -> Self {
        let mut table = ['\0'; 256];
        let mut shifted = 0u32;
        for (byte, slot) in (0..=255u8).zip(table.iter_mut()) {
            *slot = if matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF) {
                char::from(byte)
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
            };
        }
        Self(table)
    }

    /// `piece` as the BPE model of a byte-level tokenizer sees it.
    pub fn map(&self, piece: &str) -> String {
        piece.bytes().map(|b| self.0[usize::from(b)]).collect()
    }
}
