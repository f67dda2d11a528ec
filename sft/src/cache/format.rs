//! The cache file's bytes: a magic, the key, the shape and counts, then each row's token ids
//! (u32), its labels as a bit mask (a label is its token's id or -100, so one bit says which;
//! see [`Labels`]),
//! source rows (u64) and document lengths (u32), all little-endian, closed by a CRC-32 of
//! everything before it. The first few bad rows' messages
//! are not kept, only their count.

use rayon::prelude::*;

use crate::dataset::{BadRows, Shape};
use crate::prepare::{Labels, PreparedRow, PreparedSet};

/// Rows per block of [`encode`]'s parallel writing.
const ROWS_PER_BLOCK: usize = 4096;

/// Appends the bytes of one row to `out`.
fn write_row(row: &PreparedRow, out: &mut Vec<u8>) {
    out.reserve(row_bytes(row));
    for count in [row.len(), row.source_rows.len(), row.seq_lengths.len()] {
        out.extend_from_slice(&(count as u32).to_le_bytes());
    }
    let ids_start = out.len();
    out.resize(ids_start + row.len() * 4, 0);
    for (bytes, id) in out[ids_start..].chunks_exact_mut(4).zip(&row.input_ids) {
        bytes.copy_from_slice(&id.to_le_bytes());
    }
    let mask_start = out.len();
    out.resize(mask_start + row.len().div_ceil(8), 0);
    let mask = &mut out[mask_start..];
    match &row.labels {
        Labels::Every => {
            mask.fill(0xFF);
            if !row.len().is_multiple_of(8)
                && let Some(last) = mask.last_mut()
            {
                *last = (1u8 << (row.len() % 8)) - 1;
            }
        }
        Labels::Masked(trained) => {
            for (at, _) in trained.iter().enumerate().filter(|(_, t)| **t) {
                mask[at / 8] |= 1 << (at % 8);
            }
        }
    }
    out.extend(row.source_rows.iter().flat_map(|v| v.to_le_bytes()));
    out.extend(row.seq_lengths.iter().flat_map(|v| v.to_le_bytes()));
}

/// The first bytes of a cache file (the last byte is the format's version).
pub const MAGIC: &[u8; 8] = b"DSPLSFT\x02";

/// The bytes one row takes.
fn row_bytes(row: &PreparedRow) -> usize {
    12 + row.len() * 4
        + row.len().div_ceil(8)
        + row.source_rows.len() * 8
        + row.seq_lengths.len() * 4
}

/// Writes the file of `set` under `key` through `write_at(offset, bytes)`: the header, the
/// blocks of rows and the CRC-32, each at its offset. The blocks are encoded in parallel (a
/// row's bytes depend on it alone; each block's offset is known from its rows' sizes), each
/// into a buffer its thread reuses, and written from there, so no copy of the whole file is
/// held in memory; their checksums are combined in order.
pub fn write_with(
    key: u64,
    set: &PreparedSet,
    write_at: impl Fn(u64, &[u8]) -> std::io::Result<()> + Sync,
) -> std::io::Result<()> {
    let mut header = Vec::with_capacity(64);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&key.to_le_bytes());
    header.push(shape_code(set.shape));
    for count in [set.dropped_all_masked, set.bad.count, set.rows.len() as u64] {
        header.extend_from_slice(&count.to_le_bytes());
    }
    let blocks: Vec<&[PreparedRow]> = set.rows.chunks(ROWS_PER_BLOCK).collect();
    let mut offsets = Vec::with_capacity(blocks.len());
    let mut end = header.len() as u64;
    for rows in &blocks {
        offsets.push(end);
        end += rows.iter().map(row_bytes).sum::<usize>() as u64;
    }
    let checksums: Vec<crc32fast::Hasher> = blocks
        .par_iter()
        .zip(offsets)
        .map_init(Vec::new, |block, (rows, offset)| {
            block.clear();
            for row in rows.iter() {
                write_row(row, block);
            }
            let mut crc = crc32fast::Hasher::new();
            crc.update(block);
            write_at(offset, block).map(|()| crc)
        })
        .collect::<std::io::Result<_>>()?;
    write_at(0, &header)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header);
    for block in &checksums {
        crc.combine(block);
    }
    write_at(end, &crc.finalize().to_le_bytes())
}

/// The bytes of `set` under `key`, as [`write_with`] writes them.
pub fn encode(key: u64, set: &PreparedSet) -> Vec<u8> {
    let bytes = std::sync::Mutex::new(Vec::new());
    let written = write_with(key, set, |offset, part| {
        let mut bytes = bytes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (start, stop) = (offset as usize, offset as usize + part.len());
        if bytes.len() < stop {
            bytes.resize(stop, 0);
        }
        bytes[start..stop].copy_from_slice(part);
        Ok(())
    });
    debug_assert!(written.is_ok(), "writing into memory does not fail");
    bytes
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a cache file holds, or why it is not a valid one.
pub fn decode(bytes: &[u8]) -> Result<(u64, PreparedSet), String> {
    let body_len = bytes
        .len()
        .checked_sub(4)
        .ok_or("is shorter than its header")?;
    let (body, crc) = bytes.split_at(body_len);
    if !body.starts_with(MAGIC) {
        return Err("is not a dsplan token cache (or one of another version)".to_string());
    }
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Err("fails its checksum: it is truncated or damaged".to_string());
    }
    let mut reader = Reader {
        bytes: body,
        at: MAGIC.len(),
    };
    let key = reader.u64()?;
    let shape = match reader.take(1)?[0] {
        0 => Shape::Text,
        1 => Shape::PromptCompletion,
        2 => Shape::Messages,
        other => return Err(format!("names an unknown dataset shape {other}")),
    };
    let dropped_all_masked = reader.u64()?;
    let bad = BadRows {
        count: reader.u64()?,
        first: Vec::new(),
    };
    let count = reader.u64()?;
    let mut rows = Vec::new();
    for _ in 0..count {
        let (tokens, sources, documents) = (
            reader.u32()? as usize,
            reader.u32()? as usize,
            reader.u32()? as usize,
        );
        let input_ids = reader.many(tokens, 4, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))?;
        let mask = reader.take(tokens.div_ceil(8))?;
        let bit = |at: usize| mask[at / 8] & (1 << (at % 8)) != 0;
        let labels = if (0..tokens).all(bit) {
            Labels::Every
        } else {
            Labels::Masked((0..tokens).map(bit).collect())
        };
        let source_rows = reader.many(sources, 8, |b| {
            u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
        })?;
        let seq_lengths = reader.many(documents, 4, |b| {
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        })?;
        if seq_lengths.iter().map(|&l| l as usize).sum::<usize>() != tokens {
            return Err("holds a row whose document lengths do not add up".to_string());
        }
        rows.push(PreparedRow {
            input_ids,
            labels,
            source_rows: source_rows.into(),
            seq_lengths: seq_lengths.into(),
        });
    }
    if reader.at != body.len() {
        return Err("has bytes after its last row".to_string());
    }
    let set = PreparedSet {
        rows,
        shape,
        dropped_all_masked,
        bad,
    };
    Ok((key, set))
}

fn shape_code(shape: Shape) -> u8 {
    match shape {
        Shape::Text => 0,
        Shape::PromptCompletion => 1,
        Shape::Messages => 2,
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len());
        let end = end.ok_or("ends inside a row")?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ]))
    }

    fn many<T>(
        &mut self,
        n: usize,
        width: usize,
        read: impl Fn(&[u8]) -> T,
    ) -> Result<Vec<T>, String> {
        let bytes = self.take(
            n.checked_mul(width)
                .ok_or("names an impossible row length")?,
        )?;
        Ok(bytes.chunks_exact(width).map(read).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Several blocks of rows (so that the checksums are combined), written and read back.
    #[test]
    fn parts_make_a_file_that_decodes_to_the_same_set() {
        let rows: Vec<PreparedRow> = (0..3 * ROWS_PER_BLOCK + 7)
            .map(|n| {
                let input_ids: Vec<u32> =
                    (0..(n % 13) as u32 + 1).map(|t| t * 7 + n as u32).collect();
                let labels =
                    Labels::from_mask((0..input_ids.len()).map(|at| (at + n) % 3 != 0).collect());
                PreparedRow {
                    seq_lengths: smallvec::smallvec![input_ids.len() as u32],
                    source_rows: smallvec::smallvec![n as u64],
                    input_ids,
                    labels,
                }
            })
            .collect();
        let set = PreparedSet {
            rows,
            shape: Shape::Text,
            dropped_all_masked: 2,
            bad: BadRows::default(),
        };
        let mut parts = std::sync::Mutex::new(Vec::new());
        write_with(41, &set, |offset, part| {
            parts.lock().expect("lock").push((offset, part.to_vec()));
            Ok(())
        })
        .expect("writes");
        let parts = parts.get_mut().expect("lock");
        assert!(parts.len() > 4, "{} parts", parts.len());
        parts.sort();
        let bytes = encode(41, &set);
        let mut at = 0;
        for (offset, part) in parts.iter() {
            assert_eq!(*offset, at as u64, "the parts follow one another");
            assert_eq!(&bytes[at..at + part.len()], &part[..]);
            at += part.len();
        }
        assert_eq!(at, bytes.len());
        let (key, back) = decode(&bytes).expect("decodes");
        assert_eq!(key, 41);
        assert_eq!(back, set);
        let mut damaged = bytes.clone();
        let middle = damaged.len() / 2;
        damaged[middle] ^= 1;
        assert!(decode(&damaged).is_err());
    }
}
