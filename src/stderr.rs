//! Everything dsplan writes to stderr goes out one whole message per `write`.
//!
//! Ranks started as processes (`mpirun`, `torchrun`, `dsplan launch`) share one stderr, and the
//! standard library's stderr is unbuffered: `eprintln!` writes each piece of its format string
//! and each argument separately, so two ranks' lines could interleave mid-line ("… 3memory
//! pre-flight: …"). [`say!`] and [`say_text!`] format the message first and hand it to the
//! kernel in one `write_all`; a pipe keeps a write of up to `PIPE_BUF` (4 KiB) bytes whole, which
//! covers every line dsplan prints.

use std::fmt;
use std::io::Write;

/// Writes `message` and a newline to stderr in one write (see the module doc).
pub fn line(message: fmt::Arguments) {
    let mut text = message.to_string();
    text.push('\n');
    write_whole(&text);
}

/// Writes `message` to stderr, as it is, in one write (see the module doc).
pub fn text(message: fmt::Arguments) {
    write_whole(&message.to_string());
}

/// A failed write to stderr is not reported: there is nowhere left to report it, and the run's
/// exit code and outputs do not depend on it (the standard library's `eprintln!` treats a
/// closed stderr as written, too).
fn write_whole(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `eprintln!`, written in one `write`, so ranks' lines never interleave mid-line.
macro_rules! say {
    ($($arg:tt)*) => { $crate::stderr::line(format_args!($($arg)*)) };
}

/// `eprint!`, written in one `write`: for text that carries its own newlines.
macro_rules! say_text {
    ($($arg:tt)*) => { $crate::stderr::text(format_args!($($arg)*)) };
}
