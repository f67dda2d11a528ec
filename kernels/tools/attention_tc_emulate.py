"""Lane-level emulation of kernels/cu/attention_tc.cu on the CPU (numpy), for reasoning about it
without a GPU: a hand translation of its three kernels (loops, tiles, masks, online softmax,
fragment indexing per lane), with mma.sync m16n8k16 emulated from the fragment layouts written
in the .cu header (16-bit operands, f32 accumulation) and P / dS rounded to the storage type as
the kernels round them. It checks the kernels' index logic against a float64 reference and
estimates their rounding error under `dsplan report --check`'s metric; it cannot check the PTX
semantics themselves (that is the GPU's `report --check`). Not run by CI; keep it in step with
the .cu file when that changes.

    DT=bf16|f16 python3 attention_tc_emulate.py B T NH KV HS   (needs numpy)

The check's cases are B=2, T=70, NH/KV in 3/3, 4/2, 4/1, HS in 64, 128.
"""
import numpy as np
L = np.arange(32); G = L >> 2; Tq = L & 3
PAD = 8

import os
DT = os.environ.get('DT', 'bf16')
def to_bf16_bits(x):
    x = np.asarray(x, np.float32)
    if DT == 'f16':
        return x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)
def bf16_to_f32(bits):
    if DT == 'f16':
        return np.asarray(bits, np.uint16).view(np.float16).astype(np.float32)
    return (np.asarray(bits, np.uint32) << 16).view(np.float32)
def lo(x): return bf16_to_f32((x & 0xFFFF).astype(np.uint16))
def hi(x): return bf16_to_f32((x >> 16).astype(np.uint16))
def pack(lo_f, hi_f):
    return to_bf16_bits(lo_f).astype(np.uint32) | (to_bf16_bits(hi_f).astype(np.uint32) << 16)

def mma(d, a, b0, b1):
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    A[G, 2*Tq] = lo(a[0]); A[G, 2*Tq+1] = hi(a[0])
    A[G+8, 2*Tq] = lo(a[1]); A[G+8, 2*Tq+1] = hi(a[1])
    A[G, 2*Tq+8] = lo(a[2]); A[G, 2*Tq+9] = hi(a[2])
    A[G+8, 2*Tq+8] = lo(a[3]); A[G+8, 2*Tq+9] = hi(a[3])
    B[2*Tq, G] = lo(b0); B[2*Tq+1, G] = hi(b0); B[2*Tq+8, G] = lo(b1); B[2*Tq+9, G] = hi(b1)
    D = A @ B
    d[0] = (d[0] + D[G, 2*Tq]).astype(np.float32); d[1] = (d[1] + D[G, 2*Tq+1]).astype(np.float32)
    d[2] = (d[2] + D[G+8, 2*Tq]).astype(np.float32); d[3] = (d[3] + D[G+8, 2*Tq+1]).astype(np.float32)

def pair_in_row(tile, stride, row, col):
    return tile[row*stride + col].astype(np.uint32) | (tile[row*stride + col + 1].astype(np.uint32) << 16)
def pair_in_col(tile, stride, row, col):
    return tile[row*stride + col].astype(np.uint32) | (tile[(row+1)*stride + col].astype(np.uint32) << 16)
def global_pair(base, off, width, row, col, T):
    out = np.zeros(32, np.uint32)
    ok = row < T
    r = np.where(ok, row, 0)
    idx = off + r*width + col
    v = base[idx].astype(np.uint32) | (base[idx+1].astype(np.uint32) << 16)
    return np.where(ok, v, 0).astype(np.uint32)
def load_rows(rows, HS, base, off, width, first, T):
    tile = np.zeros(rows*(HS+PAD), np.uint16)
    for r in range(rows):
        if first + r < T:
            tile[r*(HS+PAD):r*(HS+PAD)+HS] = base[off + (first+r)*width: off + (first+r)*width + HS]
    return tile
def global_a(HS, base, off, width, first, T):
    a = []
    for kk in range(HS//16):
        c = kk*16 + 2*Tq
        a.append([global_pair(base, off, width, first+G, c, T), global_pair(base, off, width, first+G+8, c, T),
                  global_pair(base, off, width, first+G, c+8, T), global_pair(base, off, width, first+G+8, c+8, T)])
    return a
def c_to_a(c, kk):
    return [pack(c[2*kk][0], c[2*kk][1]), pack(c[2*kk][2], c[2*kk][3]),
            pack(c[2*kk+1][0], c[2*kk+1][1]), pack(c[2*kk+1][2], c[2*kk+1][3])]
def zeros4(n): return [[np.zeros(32, np.float32) for _ in range(4)] for _ in range(n)]
def shfl_xor(x, m): return x[L ^ m]

def forward(qkv, B, T, NH, KV, HS, scale):
    QW = NH*HS; W = (NH+2*KV)*HS; KEYS = 64
    out = np.zeros(B*T*QW, np.uint16); lse = np.zeros(B*NH*T, np.float32)
    for b in range(B):
      for h in range(NH):
        kvh = h // (NH//KV)
        for bx in range((T+63)//64):
          q0 = bx*64; rowsoff = b*T*W
          koff = rowsoff + QW + kvh*HS; voff = koff + KV*HS
          last_query = min(q0+64, T) - 1
          tiles = []
          for k0 in range(0, last_query+1, KEYS):
              tiles.append((k0, load_rows(KEYS, HS, qkv, koff, W, k0, T), load_rows(KEYS, HS, qkv, voff, W, k0, T)))
          for warp in range(4):
            qw = q0 + warp*16; rows_of = [qw+G, qw+G+8]
            qf = global_a(HS, qkv, rowsoff + h*HS, W, qw, T)
            o = zeros4(HS//8); m = [np.full(32, -np.inf, np.float32) for _ in range(2)]; l = [np.zeros(32, np.float32) for _ in range(2)]
            warp_last = min(qw+15, T-1)
            S = HS + PAD
            for (k0, ks, vs) in tiles:
                if k0 > warp_last: continue
                s = zeros4(KEYS//8)
                for j in range(KEYS//8):
                    for kk in range(HS//16):
                        c = kk*16 + 2*Tq
                        mma(s[j], qf[kk], pair_in_row(ks, S, j*8+G, c), pair_in_row(ks, S, j*8+G, c+8))
                mx = [m[0].copy(), m[1].copy()]
                for j in range(KEYS//8):
                    for c in range(4):
                        key = k0 + j*8 + 2*Tq + (c & 1)
                        v = np.where(key <= rows_of[c >> 1], s[j][c]*np.float32(scale), -np.inf).astype(np.float32)
                        s[j][c] = v; mx[c >> 1] = np.maximum(mx[c >> 1], v)
                base = [None, None]
                for r in range(2):
                    mx[r] = np.maximum(mx[r], shfl_xor(mx[r], 1)); mx[r] = np.maximum(mx[r], shfl_xor(mx[r], 2))
                    base[r] = np.where(mx[r] == -np.inf, 0, mx[r]).astype(np.float32)
                    with np.errstate(invalid='ignore'):
                        corr = np.exp(m[r] - base[r]).astype(np.float32)
                    l[r] = l[r]*corr
                    for n in range(HS//8):
                        o[n][2*r] = o[n][2*r]*corr; o[n][2*r+1] = o[n][2*r+1]*corr
                    m[r] = mx[r]
                for j in range(KEYS//8):
                    for c in range(4):
                        p = np.exp(s[j][c] - base[c >> 1]).astype(np.float32)
                        s[j][c] = p; l[c >> 1] = l[c >> 1] + p
                for kk in range(KEYS//16):
                    pa = c_to_a(s, kk)
                    for n in range(HS//8):
                        key = kk*16 + 2*Tq; d = n*8 + G
                        mma(o[n], pa, pair_in_col(vs, S, key, d), pair_in_col(vs, S, key+8, d))
            for r in range(2):
                l[r] = l[r] + shfl_xor(l[r], 1); l[r] = l[r] + shfl_xor(l[r], 2)
                for lane in range(32):
                    row = rows_of[r][lane]
                    if row >= T: continue
                    inv = 1.0/l[r][lane]
                    yo = (b*T + row)*QW + h*HS
                    for n in range(HS//8):
                        t = Tq[lane]
                        out[yo + n*8+2*t] = to_bf16_bits(o[n][2*r][lane]*inv)
                        out[yo + n*8+2*t+1] = to_bf16_bits(o[n][2*r+1][lane]*inv)
                    if Tq[lane] == 0:
                        lse[(b*NH+h)*T + row] = m[r][lane] + np.log(l[r][lane])
    return out, lse

def dkdv(dqkv, dout, qkv, lse, delta, B, T, NH, KV, HS, WARPS, QTILE, scale):
    QW = NH*HS; W = (NH+2*KV)*HS; KEYS = WARPS*16; S = HS + PAD; group = NH//KV
    for b in range(B):
      for kvh in range(KV):
        for bx in range((T+KEYS-1)//KEYS):
          k0 = bx*KEYS; rowsoff = b*T*W; koff = rowsoff + QW + kvh*HS; voff = koff + KV*HS
          ks = load_rows(KEYS, HS, qkv, koff, W, k0, T); vs = load_rows(KEYS, HS, qkv, voff, W, k0, T)
          for warp in range(WARPS):
            kw = k0 + warp*16; keys_of = [kw+G, kw+G+8]; kr = warp*16 + G
            dk = zeros4(HS//8); dv = zeros4(HS//8)
            for h in range(kvh*group, (kvh+1)*group):
              qoff = rowsoff + h*HS; doff = b*T*QW + h*HS
              for q0 in range(k0, T, QTILE):
                qs = load_rows(QTILE, HS, qkv, qoff, W, q0, T); dos = load_rows(QTILE, HS, dout, doff, QW, q0, T)
                lse_t = np.array([lse[(b*NH+h)*T + q0+i] if q0+i < T else 0 for i in range(QTILE)], np.float32)
                delta_t = np.array([delta[(b*NH+h)*T + q0+i] if q0+i < T else 0 for i in range(QTILE)], np.float32)
                if kw >= T or q0 + QTILE - 1 < kw: continue
                st = zeros4(QTILE//8); dpt = zeros4(QTILE//8)
                for kk in range(HS//16):
                    c = kk*16 + 2*Tq
                    ka = [pair_in_row(ks, S, kr, c), pair_in_row(ks, S, kr+8, c), pair_in_row(ks, S, kr, c+8), pair_in_row(ks, S, kr+8, c+8)]
                    va = [pair_in_row(vs, S, kr, c), pair_in_row(vs, S, kr+8, c), pair_in_row(vs, S, kr, c+8), pair_in_row(vs, S, kr+8, c+8)]
                    for j in range(QTILE//8):
                        qn = j*8 + G
                        mma(st[j], ka, pair_in_row(qs, S, qn, c), pair_in_row(qs, S, qn, c+8))
                        mma(dpt[j], va, pair_in_row(dos, S, qn, c), pair_in_row(dos, S, qn, c+8))
                for j in range(QTILE//8):
                    for c in range(4):
                        i = j*8 + 2*Tq + (c & 1); query = q0 + i
                        vis = (query >= keys_of[c >> 1]) & (query < T)
                        p = np.where(vis, np.exp(st[j][c]*np.float32(scale) - lse_t[i]), 0).astype(np.float32)
                        st[j][c] = p; dpt[j][c] = (p*(dpt[j][c] - delta_t[i])).astype(np.float32)
                for kk in range(QTILE//16):
                    pa = c_to_a(st, kk); da = c_to_a(dpt, kk)
                    for n in range(HS//8):
                        query = kk*16 + 2*Tq; d = n*8 + G
                        mma(dv[n], pa, pair_in_col(dos, S, query, d), pair_in_col(dos, S, query+8, d))
                        mma(dk[n], da, pair_in_col(qs, S, query, d), pair_in_col(qs, S, query+8, d))
            for r in range(2):
                for lane in range(32):
                    key = keys_of[r][lane]
                    if key >= T: continue
                    ro = (b*T + key)*W + QW + kvh*HS
                    for n in range(HS//8):
                        for e in range(2):
                            d = n*8 + 2*Tq[lane] + e
                            dqkv[ro + d] = to_bf16_bits(dk[n][2*r+e][lane]*np.float32(scale))
                            dqkv[ro + KV*HS + d] = to_bf16_bits(dv[n][2*r+e][lane])

def dq(dqkv, dout, qkv, lse, delta, B, T, NH, KV, HS, KEYS, scale):
    QW = NH*HS; W = (NH+2*KV)*HS; S = HS + PAD
    for b in range(B):
      for h in range(NH):
        kvh = h // (NH//KV)
        for bx in range((T+63)//64):
          q0 = bx*64; rowsoff = b*T*W; koff = rowsoff + QW + kvh*HS; voff = koff + KV*HS
          last_query = min(q0+64, T) - 1
          for warp in range(4):
            qw = q0 + warp*16; rows_of = [qw+G, qw+G+8]
            qf = global_a(HS, qkv, rowsoff + h*HS, W, qw, T); gf = global_a(HS, dout, b*T*QW + h*HS, QW, qw, T)
            row_lse = []; row_delta = []
            for r in range(2):
                ok = rows_of[r] < T; idx = (b*NH+h)*T + np.where(ok, rows_of[r], 0)
                row_lse.append(np.where(ok, lse[idx], 0).astype(np.float32)); row_delta.append(np.where(ok, delta[idx], 0).astype(np.float32))
            dqa = zeros4(HS//8); warp_last = min(qw+15, T-1)
            for k0 in range(0, last_query+1, KEYS):
                ks = load_rows(KEYS, HS, qkv, koff, W, k0, T); vs = load_rows(KEYS, HS, qkv, voff, W, k0, T)
                if k0 > warp_last: continue
                s = zeros4(KEYS//8); dp = zeros4(KEYS//8)
                for j in range(KEYS//8):
                    for kk in range(HS//16):
                        c = kk*16 + 2*Tq
                        mma(s[j], qf[kk], pair_in_row(ks, S, j*8+G, c), pair_in_row(ks, S, j*8+G, c+8))
                        mma(dp[j], gf[kk], pair_in_row(vs, S, j*8+G, c), pair_in_row(vs, S, j*8+G, c+8))
                for j in range(KEYS//8):
                    for c in range(4):
                        key = k0 + j*8 + 2*Tq + (c & 1); r = c >> 1
                        vis = (key <= rows_of[r]) & (rows_of[r] < T)
                        p = np.where(vis, np.exp(s[j][c]*np.float32(scale) - row_lse[r]), 0).astype(np.float32)
                        s[j][c] = (p*(dp[j][c] - row_delta[r])).astype(np.float32)
                for kk in range(KEYS//16):
                    da = c_to_a(s, kk)
                    for n in range(HS//8):
                        key = kk*16 + 2*Tq; d = n*8 + G
                        mma(dqa[n], da, pair_in_col(ks, S, key, d), pair_in_col(ks, S, key+8, d))
            for r in range(2):
                for lane in range(32):
                    row = rows_of[r][lane]
                    if row >= T: continue
                    yo = (b*T + row)*W + h*HS
                    for n in range(HS//8):
                        t = Tq[lane]
                        dqkv[yo + n*8+2*t] = to_bf16_bits(dqa[n][2*r][lane]*np.float32(scale))
                        dqkv[yo + n*8+2*t+1] = to_bf16_bits(dqa[n][2*r+1][lane]*np.float32(scale))

def reference(qkv, dout, B, T, NH, KV, HS, scale):
    W = (NH+2*KV)*HS; QW = NH*HS
    x = qkv.reshape(B, T, W).astype(np.float64); go = dout.reshape(B, T, NH, HS).astype(np.float64)
    q = x[:, :, :QW].reshape(B, T, NH, HS); k = x[:, :, QW:QW+KV*HS].reshape(B, T, KV, HS); v = x[:, :, QW+KV*HS:].reshape(B, T, KV, HS)
    rep = NH//KV; kh = np.repeat(k, rep, axis=2); vh = np.repeat(v, rep, axis=2)
    s = np.einsum('bqhd,bkhd->bhqk', q, kh)*scale
    mask = np.tril(np.ones((T, T), bool)); s = np.where(mask, s, -np.inf)
    mx = s.max(-1, keepdims=True); p = np.exp(s-mx); l = p.sum(-1, keepdims=True); p = p/l
    o = np.einsum('bhqk,bkhd->bqhd', p, vh)
    lse = (mx + np.log(l))[..., 0]
    dp = np.einsum('bqhd,bkhd->bhqk', go, vh)
    dlt = (go*o).sum(-1).transpose(0, 2, 1)
    ds = p*(dp - dlt[..., None])
    dqh = np.einsum('bhqk,bkhd->bqhd', ds, kh)*scale
    dkh = np.einsum('bhqk,bqhd->bkhd', ds, q)*scale
    dvh = np.einsum('bhqk,bqhd->bkhd', p, go)
    dk = dkh.reshape(B, T, KV, rep, HS).sum(3); dv = dvh.reshape(B, T, KV, rep, HS).sum(3)
    dqkv = np.concatenate([dqh.reshape(B, T, QW), dk.reshape(B, T, KV*HS), dv.reshape(B, T, KV*HS)], -1)
    return o.reshape(-1), lse.reshape(-1), dqkv.reshape(-1), o

def rel(got, want):
    scale = np.abs(want).max()
    return (np.abs(got-want)/(np.abs(want)+1e-2*scale)).max()

import sys
B, T, NH, KV, HS = [int(a) for a in sys.argv[1:6]]
WARPS, QTILE, KEYS_DQ = (4, 64, 64) if HS == 64 else (2, 32, 32)
rng = np.random.default_rng(1)
W = (NH+2*KV)*HS
qkv = to_bf16_bits(rng.uniform(-1, 1, B*T*W).astype(np.float32))
dout = to_bf16_bits(rng.uniform(-1, 1, B*T*NH*HS).astype(np.float32))
scale = np.float32(HS**-0.5)
o_ref, lse_ref, dqkv_ref, o64 = reference(bf16_to_f32(qkv), bf16_to_f32(dout), B, T, NH, KV, HS, float(scale))
out, lse = forward(qkv, B, T, NH, KV, HS, scale)
print(DT, sys.argv[1:], "forward rel", rel(bf16_to_f32(out), o_ref), "lse abs", np.abs(lse-lse_ref).max())
# delta as the preprocess kernel computes it, from the kernel's out
delta = (bf16_to_f32(dout).reshape(B, T, NH, HS).astype(np.float64)*bf16_to_f32(out).reshape(B, T, NH, HS)).sum(-1).transpose(0, 2, 1).reshape(-1).astype(np.float32)
dqkv = np.zeros(B*T*W, np.uint16)
dkdv(dqkv, dout, qkv, lse, delta, B, T, NH, KV, HS, WARPS, QTILE, scale)
dq(dqkv, dout, qkv, lse, delta, B, T, NH, KV, HS, KEYS_DQ, scale)
got = bf16_to_f32(dqkv).reshape(B, T, W); want = dqkv_ref.reshape(B, T, W)
QW = NH*HS
print("dq rel", rel(got[..., :QW], want[..., :QW]), "dk rel", rel(got[..., QW:QW+KV*HS], want[..., QW:QW+KV*HS]), "dv rel", rel(got[..., QW+KV*HS:], want[..., QW+KV*HS:]))
print("dqkv rel (the check's metric)", rel(got.reshape(-1), want.reshape(-1)))
