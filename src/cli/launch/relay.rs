//! Turns `mpirun --tag-output`'s stream back into whole lines, one rank each, prefixed
//! `[rank R] `.
//!
//! Open MPI tags every chunk a rank writes, not every line: a rank whose line reaches the pipe
//! in two writes comes out as `[1,0]<stderr>:step=1 [1,0]<stderr>:loss=2.5`, and another rank's
//! chunk may sit between the two halves (`[1,0]<stderr>:step=1 [1,1]<stderr>:step=1\n...`). So
//! the relay reads tags anywhere in a line, gives each tagged piece to its rank's pending line,
//! and ends a rank's line where the newline falls. Text outside any tag (mpirun's own messages)
//! passes through unchanged.

use std::collections::BTreeMap;

/// The pending (unterminated) text of every rank, and the lines ready to print.
#[derive(Debug, Default)]
pub struct RankLines {
    pending: BTreeMap<usize, String>,
}

/// One piece of a line: text with the rank whose tag preceded it, or untagged text.
#[derive(Debug, PartialEq, Eq)]
struct Piece<'a> {
    rank: Option<usize>,
    text: &'a str,
}

impl RankLines {
    /// Feeds one line read from mpirun (without its newline) and returns the complete lines
    /// it finishes, already prefixed.
    pub fn push_line(&mut self, line: &str) -> Vec<String> {
        let pieces = split_tags(line);
        let Some(last) = pieces.last() else {
            return vec![String::new()]; // an empty line is still a line
        };
        let ending = last.rank;
        let mut done = Vec::new();
        let mut untagged = String::new();
        for piece in &pieces {
            match piece.rank {
                Some(rank) => self.pending.entry(rank).or_default().push_str(piece.text),
                None => untagged.push_str(piece.text),
            }
        }
        if !untagged.is_empty() || ending.is_none() {
            done.push(untagged);
        }
        if let Some(rank) = ending {
            let text = self.pending.remove(&rank).unwrap_or_default();
            done.push(format!("[rank {rank}] {text}"));
        }
        done
    }

    /// What is left when the stream ends: every rank's unterminated text, in rank order.
    pub fn finish(&mut self) -> Vec<String> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(rank, text)| format!("[rank {rank}] {text}"))
            .collect()
    }
}

/// Splits a line at every `[job,rank]<stream>:` tag.
fn split_tags(line: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut rank = None;
    let mut start = 0;
    let mut search = 0;
    while let Some(offset) = line[search..].find('[') {
        let at = search + offset;
        match parse_tag(&line[at..]) {
            Some((tagged, length)) => {
                if at > start || rank.is_some() {
                    pieces.push(Piece {
                        rank,
                        text: &line[start..at],
                    });
                }
                rank = Some(tagged);
                start = at + length;
                search = start;
            }
            None => search = at + 1,
        }
    }
    if rank.is_some() || start < line.len() {
        pieces.push(Piece {
            rank,
            text: &line[start..],
        });
    }
    pieces
}

/// `[1,3]<stderr>:` at the start of `text`: the rank and the tag's length.
fn parse_tag(text: &str) -> Option<(usize, usize)> {
    let rest = text.strip_prefix('[')?;
    let (ids, rest) = rest.split_once(']')?;
    let (job, rank) = ids.split_once(',')?;
    if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let rank: usize = rank.parse().ok()?;
    let stream = rest.strip_prefix('<')?;
    let (name, _) = stream.split_once(">:")?;
    if !["stdout", "stderr", "stddiag"].contains(&name) {
        return None;
    }
    let length = 1 + ids.len() + 1 + 1 + name.len() + 2;
    Some((rank, length))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(lines: &[&str]) -> Vec<String> {
        let mut relay = RankLines::default();
        let mut out: Vec<String> = lines.iter().flat_map(|l| relay.push_line(l)).collect();
        out.extend(relay.finish());
        out
    }

    #[test]
    fn a_whole_tagged_line_gets_its_rank_prefix() {
        assert_eq!(feed(&["[1,3]<stderr>:loss 2.5"]), ["[rank 3] loss 2.5"]);
        assert_eq!(feed(&["[1,0]<stdout>:{}"]), ["[rank 0] {}"]);
    }

    #[test]
    fn untagged_lines_pass_unchanged() {
        assert_eq!(feed(&["mpirun noticed"]), ["mpirun noticed"]);
        assert_eq!(feed(&["[Rank 0] step=1"]), ["[Rank 0] step=1"]);
        assert_eq!(feed(&[""]), [""]);
    }

    #[test]
    fn a_line_written_in_two_chunks_is_one_line() {
        assert_eq!(
            feed(&["[1,0]<stderr>:[Rank 0] step=10 [1,0]<stderr>:loss=2.5"]),
            ["[rank 0] [Rank 0] step=10 loss=2.5"]
        );
    }

    #[test]
    fn another_ranks_chunk_between_two_halves_keeps_both_lines_whole() {
        let out = feed(&[
            "[1,0]<stderr>:[Rank 0] step=10 [1,1]<stderr>:rank one says hi",
            "[1,0]<stderr>:loss=2.5",
        ]);
        assert_eq!(
            out,
            [
                "[rank 1] rank one says hi",
                "[rank 0] [Rank 0] step=10 loss=2.5"
            ]
        );
    }

    #[test]
    fn text_that_only_looks_like_a_tag_is_text() {
        assert_eq!(
            feed(&["[1,0]<stderr>:array [1,2] and [3,x]<stderr>: stay"]),
            ["[rank 0] array [1,2] and [3,x]<stderr>: stay"]
        );
    }

    #[test]
    fn unterminated_text_is_flushed_at_the_end_in_rank_order() {
        let out = feed(&["[1,1]<stderr>:one [1,0]<stderr>:zero"]);
        assert_eq!(out, ["[rank 0] zero", "[rank 1] one "]);
    }
}
