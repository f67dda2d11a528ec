//! The residual connection: `out = a + b`.
//!
//! Its backward pass is the identity into both inputs. [`super::Gpt2`] exploits that by carrying
//! one residual-stream gradient buffer through all blocks instead of calling
//! [`residual_backward`]; the function states the rule and is what a backend must match.

use rayon::prelude::*;

/// Elements per parallel work item.
const CHUNK: usize = 8192;

/// `out = a + b`, element-wise; all `(N)`.
pub fn residual_forward(out: &mut [f32], a: &[f32], b: &[f32]) {
    out.par_chunks_mut(CHUNK)
        .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
        .for_each(|(out, (a, b))| {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = x + y;
            }
        });
}

/// `dst += src`, element-wise (a reduced gradient bucket added into a rank's gradient
/// partition); both `(N)`.
pub fn accumulate(dst: &mut [f32], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

/// `da += dout`, `db += dout`; all `(N)`.
pub fn residual_backward(da: &mut [f32], db: &mut [f32], dout: &[f32]) {
    for ((x, y), &d) in da.iter_mut().zip(db.iter_mut()).zip(dout) {
        *x += d;
        *y += d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_adds_and_backward_copies() {
        let mut out = [0.0; 3];
        residual_forward(&mut out, &[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]);
        assert_eq!(out, [11.0, 22.0, 33.0]);
        let (mut da, mut db) = ([1.0; 3], [0.0; 3]);
        residual_backward(&mut da, &mut db, &[0.5, -1.0, 2.0]);
        assert_eq!(da, [1.5, 0.0, 3.0]);
        assert_eq!(db, [0.5, -1.0, 2.0]);
    }
}
