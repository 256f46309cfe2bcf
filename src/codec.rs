//! The encodings of a bucket's state, all pure and lossless:
//!
//! - [`packed`]: what Redis holds in memory for a key, 32 bytes for every
//!   realistic bucket (the glue keeps a wide form for the rest);
//! - [`wire`]: the compact binary form replicated and written to the AOF by
//!   `TB.SETSTATE key state`, and saved in RDB files (encoding version 2);
//! - [`rdb_v1`]: the six integers of the RDB encoding version 1, still loaded.
//!
//! Every decoder refuses anything that is not a valid state, so corrupt
//! input never becomes a bucket; the fuzz target `state_codecs` round-trips
//! all of them.
//!
//! A bucket that holds leases (issue 13, [`crate::lease`]) has more
//! state: it gets the wire tag 3, with the leases after the fields of tag 1
//! (tag 2, the form before lease ids were random and a lease could keep
//! its tokens at expiry, is still decoded).
//! RDB version 2 saves whatever the wire form is, so RDB, `DUMP`, the AOF
//! and replication carry it with no new format of their own; the glue holds
//! such states in its wide form (the packed form is for the bucket alone),
//! and the digest adds the extra fields.

/// The compact binary form of a bucket's absolute state, as replicated and
/// written to the AOF by `TB.SETSTATE key state`.
///
/// Layout: the tag byte [`wire::TAG`], then six unsigned LEB128 varints:
/// zigzag(tokens), zigzag(updated_us), rate numerator, rate denominator,
/// capacity, and the expiry: 0 for none, else `1 + zigzag(expire_at_ms -
/// floor(updated_us / 1000))`. A typical state takes about 20 bytes instead of
/// the ~85 of six decimal arguments, which halves the replication stream per
/// write. The encoding is lossless; decoding rejects truncated, overlong or
/// trailing input.
pub mod wire {
    use crate::bucket::{Bucket, Rate};
    use crate::lease::{Delta, Lease, Leases, MAX_LEASES};

    /// First byte of an encoded state (format version 1). Never an ASCII digit
    /// or `-`, so it cannot be mistaken for the decimal form's first field.
    pub const TAG: u8 = 0x01;
    /// Longest encoding: the tag, a 128-bit varint and five 64-bit ones.
    pub const MAX_LEN: usize = 1 + 19 + 5 * 10;

    fn zigzag(v: i128) -> u128 {
        ((v << 1) ^ (v >> 127)) as u128
    }

    fn unzigzag(v: u128) -> i128 {
        (v >> 1) as i128 ^ -((v & 1) as i128)
    }

    fn put(out: &mut [u8; MAX_LEN], len: &mut usize, mut v: u128) {
        while v >= 0x80 {
            out[*len] = (v as u8) | 0x80;
            *len += 1;
            v >>= 7;
        }
        out[*len] = v as u8;
        *len += 1;
    }

    /// Reads one varint of at most `max_bits` bits, advancing `input`.
    fn take(input: &mut &[u8], max_bits: u32) -> Option<u128> {
        let mut v: u128 = 0;
        let mut shift = 0u32;
        loop {
            let (&byte, rest) = input.split_first()?;
            *input = rest;
            let bits = u128::from(byte & 0x7f);
            if shift >= max_bits
                || (shift > 0 && byte == 0)
                || bits.checked_shr(max_bits - shift).unwrap_or(0) != 0
            {
                return None; // too long, overlong (trailing zero byte), or too large
            }
            v |= bits << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
            shift += 7;
        }
    }

    /// Encodes `b` with its key's absolute expiry in ms (0: none) into `out`;
    /// returns the length used.
    pub fn encode(b: &Bucket, expire_at_ms: i64, out: &mut [u8; MAX_LEN]) -> usize {
        let mut len = 0;
        out[len] = TAG;
        len += 1;
        put(out, &mut len, zigzag(b.tokens));
        put(out, &mut len, zigzag(i128::from(b.updated_us)));
        put(out, &mut len, u128::from(b.rate.num()));
        put(out, &mut len, u128::from(b.rate.den()));
        put(out, &mut len, u128::from(b.capacity));
        let expiry = if expire_at_ms == 0 {
            0
        } else {
            let base = i128::from(b.updated_us.div_euclid(1000));
            1 + zigzag(i128::from(expire_at_ms) - base)
        };
        put(out, &mut len, expiry);
        len
    }

    /// Decodes a state written by [`encode`]: the bucket and the absolute
    /// expiry in ms (0: none). `None` for anything else, including a state
    /// that breaks the bucket invariants or a negative expiry.
    pub fn decode(bytes: &[u8]) -> Option<(Bucket, i64)> {
        let (&tag, mut input) = bytes.split_first()?;
        if tag != TAG {
            return None;
        }
        let tokens = unzigzag(take(&mut input, 128)?);
        let updated_us = i64::try_from(unzigzag(take(&mut input, 64)?)).ok()?;
        let num = take(&mut input, 64)?;
        let den = take(&mut input, 64)?;
        let capacity = u64::try_from(take(&mut input, 64)?).ok()?;
        let expiry = take(&mut input, 66)?;
        if !input.is_empty() {
            return None;
        }
        let expire_at_ms = if expiry == 0 {
            0
        } else {
            let base = i128::from(updated_us.div_euclid(1000));
            let at = i64::try_from(base + unzigzag(expiry - 1)).ok()?;
            if at <= 0 {
                return None;
            }
            at
        };
        let rate = Rate::new(num, den)?;
        let b = Bucket {
            tokens,
            updated_us,
            rate,
            capacity,
        };
        // An unreduced rate would not round-trip: reject it.
        let canonical = u128::from(rate.num()) == num && u128::from(rate.den()) == den;
        (canonical && b.is_valid()).then_some((b, expire_at_ms))
    }

    /// First byte of a state with leases as written up to issue 18 (format
    /// version 2, still decoded): the fields of [`TAG`] after it, then
    /// varints `last_id` (ignored now: ids are random), the number of
    /// leases, and for each `id`, `n`, `zigzag(expires_us)`, in the order of
    /// their ids. Such leases all give their tokens back at expiry.
    pub const TAG_LEASES_V2: u8 = 0x02;
    /// First byte of a state with leases (format version 3): the fields of
    /// [`TAG`] after it, then varints: the number of leases, and for each in
    /// the order held (by expiry) `id`, `2 n + keep`, `zigzag(expires_us)`.
    pub const TAG_LEASES: u8 = 0x03;
    /// Longest encoding of a state with leases.
    pub const MAX_LEN_LEASES: usize = MAX_LEN + 10 + 3 + MAX_LEASES * (10 + 10 + 10);

    /// Appends `v` as a varint to `out`.
    fn push(out: &mut Vec<u8>, v: u128) {
        let mut one = [0u8; MAX_LEN];
        let mut n = 0;
        put(&mut one, &mut n, v);
        out.extend_from_slice(&one[..n]);
    }

    /// Encodes `b` with its leases and expiry into `out` (cleared first):
    /// exactly [`encode`]'s bytes when the leases are blank, else the
    /// [`TAG_LEASES`] form.
    pub fn encode_state(b: &Bucket, leases: &Leases, expire_at_ms: i64, out: &mut Vec<u8>) {
        let mut head = [0u8; MAX_LEN];
        let len = encode(b, expire_at_ms, &mut head);
        out.clear();
        out.extend_from_slice(&head[..len]);
        if leases.is_blank() {
            return;
        }
        out[0] = TAG_LEASES;
        push(out, leases.held.len() as u128);
        for l in &leases.held {
            push_lease(out, l);
        }
    }

    /// First byte of a change to a bucket with leases (issue 18): the
    /// fields of [`TAG`] after it (the bucket as the command left it), then
    /// varints: the leases held after, the expiry time through which leases
    /// were dropped (0: none, else `1 + zigzag(t)`), the number of leases
    /// released and their ids, the number granted and each as in
    /// [`TAG_LEASES`]. A few bytes whatever the number of leases held.
    pub const TAG_DELTA: u8 = 0x04;

    /// Appends a lease as [`TAG_LEASES`] writes it.
    fn push_lease(out: &mut Vec<u8>, l: &Lease) {
        push(out, u128::from(l.id));
        push(out, u128::from(l.n) << 1 | u128::from(l.keep));
        push(out, zigzag(i128::from(l.expires_us)));
    }

    /// Reads a lease written by [`push_lease`].
    fn take_lease(input: &mut &[u8]) -> Option<Lease> {
        let id = u64::try_from(take(input, 64)?).ok()?;
        let v = take(input, 65)?;
        let n = u64::try_from(v >> 1).ok()?;
        let expires_us = i64::try_from(unzigzag(take(input, 64)?)).ok()?;
        Some(Lease {
            id,
            n,
            expires_us,
            keep: v & 1 == 1,
        })
    }

    /// Encodes `b` with its expiry and the change `d` to its leases into
    /// `out` (cleared first).
    pub fn encode_delta(b: &Bucket, d: &Delta, expire_at_ms: i64, out: &mut Vec<u8>) {
        let mut head = [0u8; MAX_LEN];
        let len = encode(b, expire_at_ms, &mut head);
        out.clear();
        out.extend_from_slice(&head[..len]);
        out[0] = TAG_DELTA;
        push(out, d.held_after as u128);
        push(
            out,
            d.expired_through.map_or(0, |t| 1 + zigzag(i128::from(t))),
        );
        push(out, d.released.len() as u128);
        for &id in &d.released {
            push(out, u128::from(id));
        }
        push(out, d.granted.len() as u128);
        for l in &d.granted {
            push_lease(out, l);
        }
    }

    /// Decodes a change written by [`encode_delta`]; `None` for anything
    /// else (the leases it grants must be valid ones, and it names no more
    /// than [`MAX_LEASES`] of each).
    pub fn decode_delta(bytes: &[u8]) -> Option<(Bucket, Delta, i64)> {
        if *bytes.first()? != TAG_DELTA {
            return None;
        }
        let (b, at, mut input) = split_head(bytes)?;
        let held_after = usize::try_from(take(&mut input, 64)?).ok()?;
        let expired_through = match take(&mut input, 66)? {
            0 => None,
            t => Some(i64::try_from(unzigzag(t - 1)).ok()?),
        };
        let count = |input: &mut &[u8]| {
            usize::try_from(take(input, 64)?)
                .ok()
                .filter(|&c| c <= MAX_LEASES)
        };
        let released = (0..count(&mut input)?)
            .map(|_| u64::try_from(take(&mut input, 64)?).ok())
            .collect::<Option<Vec<u64>>>()?;
        let granted = (0..count(&mut input)?)
            .map(|_| take_lease(&mut input))
            .collect::<Option<Vec<Lease>>>()?;
        let valid = granted.iter().all(|l| Leases::new(vec![*l]).is_valid());
        (input.is_empty() && valid && held_after <= MAX_LEASES).then_some((
            b,
            Delta {
                expired_through,
                released,
                granted,
                held_after,
            },
            at,
        ))
    }

    /// Splits a state with leases into the bucket and its expiry (decoded
    /// as tag 1) and the bytes of the leases.
    fn split_head(bytes: &[u8]) -> Option<(Bucket, i64, &[u8])> {
        let mut input = &bytes[1..];
        for bits in [128, 64, 64, 64, 64, 66] {
            take(&mut input, bits)?;
        }
        let head_len = bytes.len() - input.len();
        let mut head = bytes[..head_len].to_vec();
        head[0] = TAG;
        let (b, at) = decode(&head)?;
        Some((b, at, input))
    }

    /// Decodes a state written by [`encode_state`] (any tag, the version 2
    /// leases put in expiry order); `None` for anything else, including
    /// leases that break their invariants.
    pub fn decode_state(bytes: &[u8]) -> Option<(Bucket, Leases, i64)> {
        let tag = *bytes.first()?;
        if tag == TAG {
            return decode(bytes).map(|(b, at)| (b, Leases::default(), at));
        }
        if tag != TAG_LEASES && tag != TAG_LEASES_V2 {
            return None;
        }
        let (b, at, mut input) = split_head(bytes)?;
        if tag == TAG_LEASES_V2 {
            take(&mut input, 64)?; // last_id
        }
        let count = usize::try_from(take(&mut input, 64)?).ok()?;
        if count > MAX_LEASES {
            return None;
        }
        let mut held = Vec::with_capacity(count);
        for _ in 0..count {
            if tag == TAG_LEASES {
                held.push(take_lease(&mut input)?);
                continue;
            }
            let id = u64::try_from(take(&mut input, 64)?).ok()?;
            let n = u64::try_from(take(&mut input, 64)?).ok()?;
            let expires_us = i64::try_from(unzigzag(take(&mut input, 64)?)).ok()?;
            held.push(Lease {
                id,
                n,
                expires_us,
                keep: false,
            });
        }
        if tag == TAG_LEASES_V2 {
            // Held by id then; equal expiries keep that (grant) order.
            held.sort_by_key(|l| l.expires_us);
        }
        let leases = Leases::new(held);
        // Blank leases are written as tag 1: a tag 3 without any would not
        // round-trip.
        let canonical = tag == TAG_LEASES_V2 || !leases.is_blank();
        (input.is_empty() && leases.is_valid() && canonical).then_some((b, leases, at))
    }
}

/// The form Redis holds in memory for a key: four 64-bit words, so that a
/// bucket with its key and expiry takes no more memory than the Lua
/// script's hash (jemalloc rounds a 48-byte value up to 48, a 32-byte one
/// to 32). A state that does not fit 256 bits is held in a wide form by the
/// glue instead; [`pack`] says which, at every write.
///
/// Layout: a bit string over the four words, least significant bit of word
/// 0 first. Bit 0 is 0 (the wide form has 1 there). Then three 6-bit
/// widths: of the rate's numerator, its denominator and the capacity. Then
/// `updated_us` in 52 bits (1970 to 2112), the three fields at exactly
/// their widths, and in the bits left the deficit `capacity * 1e9 -
/// tokens` (never negative), with zeros above it.
///
/// Every state within [`FITS`] packs: capacity up to 2^40 (a trillion
/// tokens), debt up to 2^41 tokens, a reduced rate with a numerator up to
/// 2^40 and a denominator up to 2^30 (19 + 52 + 41 + 31 + 41 + 72 = 256
/// bits); many more do (a byte bucket of capacity 1e15 at 1e9/s needs 233).
pub mod packed {
    use crate::bucket::{Bucket, Rate, NANOS};

    /// Words in the packed form.
    pub const WORDS: usize = 4;
    const BITS: u32 = WORDS as u32 * 64;
    /// Bit 0 and the three widths.
    const HEADER: u32 = 1 + 3 * 6;
    /// Bits of the stored time.
    const TIME: u32 = 52;

    /// Bounds within which every state packs (each inclusive): capacity,
    /// deepest debt in tokens, numerator, denominator.
    pub const FITS: (u64, u64, u64, u64) = (1 << 40, 1 << 41, 1 << 40, 1 << 30);

    fn width(v: u128) -> u32 {
        128 - v.leading_zeros()
    }

    /// A cursor over the bit string.
    struct Bits<'a> {
        words: &'a mut [u64; WORDS],
        at: u32,
    }

    impl Bits<'_> {
        /// Writes the low `n` bits of `v` (n <= 128, the rest of `v` zero).
        fn put(&mut self, mut v: u128, mut n: u32) {
            while n > 0 {
                let (word, off) = ((self.at / 64) as usize, self.at % 64);
                let take = (64 - off).min(n);
                let low = (v & ((1u128 << take) - 1)) as u64;
                self.words[word] |= low << off;
                v >>= take;
                self.at += take;
                n -= take;
            }
        }

        /// Reads `n` bits (n <= 128).
        fn get(&mut self, n: u32) -> u128 {
            let mut v = 0u128;
            let mut done = 0;
            while done < n {
                let (word, off) = ((self.at / 64) as usize, self.at % 64);
                let take = (64 - off).min(n - done);
                let bits = (self.words[word] >> off) & (u64::MAX >> (64 - take));
                v |= u128::from(bits) << done;
                self.at += take;
                done += take;
            }
            v
        }
    }

    /// The packed form of `b`, or `None` if it does not fit 256 bits.
    pub fn pack(b: &Bucket) -> Option<[u64; WORDS]> {
        let time = u64::try_from(b.updated_us)
            .ok()
            .filter(|&t| t < 1 << TIME)?;
        let fields = [
            u128::from(b.rate.num()),
            u128::from(b.rate.den()),
            u128::from(b.capacity),
        ];
        let deficit = (b.cap_nanos() - b.tokens) as u128;
        let used = HEADER + TIME + fields.iter().map(|&f| width(f)).sum::<u32>();
        if used + width(deficit) > BITS {
            return None;
        }
        let mut words = [0u64; WORDS];
        let mut bits = Bits {
            words: &mut words,
            at: 1,
        };
        for &f in &fields {
            bits.put(width(f).into(), 6);
        }
        bits.put(time.into(), TIME);
        for &f in &fields {
            bits.put(f, width(f));
        }
        bits.put(deficit, width(deficit));
        Some(words)
    }

    /// The fields of a packed form, the widths as stored: numerator,
    /// denominator, capacity, time and deficit (`None` if they overrun).
    fn fields(words: &[u64; WORDS]) -> Option<[u128; 5]> {
        let mut copy = *words;
        let mut bits = Bits {
            words: &mut copy,
            at: 1,
        };
        let widths = [bits.get(6), bits.get(6), bits.get(6)].map(|w| w as u32);
        let used = HEADER + TIME + widths.iter().sum::<u32>();
        if words[0] & 1 != 0 || used > BITS {
            return None;
        }
        let time = bits.get(TIME);
        let [num, den, cap] = widths.map(|w| bits.get(w));
        let rest = BITS - used;
        let deficit = bits.get(rest.min(128));
        if rest > 128 && bits.get(rest - 128) != 0 {
            return None;
        }
        Some([num, den, cap, time, deficit])
    }

    /// The bucket in a form made by [`pack`]. Trusts its input (it reads only
    /// what this module wrote): the rate is taken as reduced and in bounds,
    /// and an impossible input gives an unspecified bucket, never a panic.
    pub fn unpack(words: &[u64; WORDS]) -> Bucket {
        let [num, den, cap, time, deficit] = fields(words).unwrap_or([0, 1, 0, 0, 0]);
        let capacity = cap as u64;
        Bucket {
            tokens: (i128::from(capacity) * NANOS).wrapping_sub(deficit as i128),
            updated_us: time as i64,
            rate: Rate::from_reduced(num as u64, den.max(1) as u64),
            capacity,
        }
    }

    /// The bucket in any four words, if they are exactly what [`pack`] makes
    /// of a valid bucket (minimal widths, zero padding, a reduced rate).
    pub fn unpack_checked(words: &[u64; WORDS]) -> Option<Bucket> {
        let [num, den, cap, time, deficit] = fields(words)?;
        let rate = Rate::new(num, den)?;
        let capacity = u64::try_from(cap).ok()?;
        let b = Bucket {
            tokens: (i128::from(capacity) * NANOS).checked_sub(i128::try_from(deficit).ok()?)?,
            updated_us: time as i64,
            rate,
            capacity,
        };
        let canonical = u128::from(rate.num()) == num && u128::from(rate.den()) == den;
        (canonical && b.is_valid() && pack(&b) == Some(*words)).then_some(b)
    }
}

/// The RDB encoding version 1 of a bucket (module type encoding version 1,
/// written up to this version of the module): six integers.
pub mod rdb_v1 {
    use crate::bucket::{Bucket, Rate};

    /// The bucket saved as tokens (low and high 64 bits of the two's
    /// complement), `updated_us`, rate numerator and denominator, and
    /// capacity; `None` if they are no valid state (the rate is reduced
    /// first, as version 1 did).
    pub fn decode(fields: [u64; 6]) -> Option<Bucket> {
        let [lo, hi, updated, num, den, capacity] = fields;
        let b = Bucket {
            tokens: ((u128::from(hi) << 64) | u128::from(lo)) as i128,
            updated_us: updated as i64,
            rate: Rate::new(u128::from(num), u128::from(den))?,
            capacity,
        };
        b.is_valid().then_some(b)
    }

    /// The six integers version 1 saves for `b` (for tests of the loader).
    pub fn encode(b: &Bucket) -> [u64; 6] {
        let t = b.tokens as u128;
        [
            t as u64,
            (t >> 64) as u64,
            b.updated_us as u64,
            b.rate.num(),
            b.rate.den(),
            b.capacity,
        ]
    }
}

/// The RDB encoding version 2 (current): one string, the [`wire`] form
/// without an expiry (Redis saves a key's expiry itself).
pub mod rdb_v2 {
    use super::wire;
    use crate::bucket::Bucket;
    use crate::lease::Leases;

    /// Longest payload without leases.
    pub const MAX_LEN: usize = wire::MAX_LEN;
    /// Longest payload with leases.
    pub const MAX_LEN_LEASES: usize = wire::MAX_LEN_LEASES;

    /// Encodes `b` into `out`; returns the length used.
    pub fn encode(b: &Bucket, out: &mut [u8; MAX_LEN]) -> usize {
        wire::encode(b, 0, out)
    }

    /// The bucket in a payload made by [`encode`]; `None` for anything else
    /// (including a wire form that carries an expiry).
    pub fn decode(bytes: &[u8]) -> Option<Bucket> {
        match wire::decode(bytes)? {
            (b, 0) => Some(b),
            _ => None,
        }
    }

    /// Encodes `b` with its leases into `out` (the [`wire::encode_state`]
    /// form without an expiry).
    pub fn encode_state(b: &Bucket, leases: &Leases, out: &mut Vec<u8>) {
        wire::encode_state(b, leases, 0, out)
    }

    /// The bucket and leases in a payload made by [`encode_state`] (or
    /// [`encode`]); `None` for anything else.
    pub fn decode_state(bytes: &[u8]) -> Option<(Bucket, Leases)> {
        match wire::decode_state(bytes)? {
            (b, leases, 0) => Some((b, leases)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{
        Bucket, Limits, Rate, MAX_AMOUNT, MAX_DEBT_NANOS, MAX_RATE_DEN, MAX_RATE_NUM, NANOS,
    };
    use proptest::prelude::*;

    fn lim(num: u128, den: u128, cap: u64) -> Limits {
        Limits {
            rate: Rate::new(num, den).unwrap(),
            capacity: cap,
        }
    }

    fn arb_limits() -> impl Strategy<Value = Limits> {
        (
            prop_oneof![
                Just(0u128),
                1u128..1_000_000_000_000,
                1u128..100,
                Just(MAX_RATE_NUM as u128)
            ],
            prop_oneof![
                Just(1u128),
                1u128..100_000,
                Just(86_400u128),
                Just(MAX_RATE_DEN as u128)
            ],
            prop_oneof![0u64..20, 1u64..1_000_000, Just(MAX_AMOUNT)],
        )
            .prop_filter_map("rate in range", |(num, den, capacity)| {
                Some(Limits {
                    rate: Rate::new(num, den)?,
                    capacity,
                })
            })
    }

    /// Any valid state: tokens from the deepest debt to capacity, any time.
    fn arb_bucket() -> impl Strategy<Value = Bucket> {
        (
            arb_limits(),
            prop_oneof![
                -(1i128 << 99)..(1i128 << 84),
                -(10 * NANOS)..(10 * NANOS),
                Just(0i128),
                Just(-MAX_DEBT_NANOS + 1)
            ],
            prop_oneof![
                any::<i64>(),
                1_700_000_000_000_000i64..1_900_000_000_000_000
            ],
        )
            .prop_map(|(l, tokens, updated_us)| {
                let mut b = Bucket::full(l, updated_us);
                b.tokens = tokens.min(b.cap_nanos());
                b
            })
    }

    #[test]
    fn wire_state_is_compact_and_strict() {
        let mut b = Bucket::full(lim(10, 1, 100), 1_795_238_169_873_123);
        b.tokens = 98_140_000_123;
        let at = 1_795_238_170_059;
        let mut buf = [0u8; wire::MAX_LEN];
        let len = wire::encode(&b, at, &mut buf);
        assert!(len <= 20, "typical state in {len} bytes");
        assert_eq!(wire::decode(&buf[..len]), Some((b, at)));
        let none = wire::encode(&b, 0, &mut buf);
        assert_eq!(wire::decode(&buf[..none]), Some((b, 0)));
        let len = wire::encode(&b, at, &mut buf);
        let good = buf[..len].to_vec();
        for cut in 0..len {
            assert_eq!(wire::decode(&good[..cut]), None, "truncated at {cut}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(wire::decode(&trailing), None, "trailing byte");
        let mut tag = good.clone();
        tag[0] = b'9';
        assert_eq!(wire::decode(&tag), None, "decimal first byte");
        // An overlong varint (a continuation ending in a zero byte) is refused.
        let mut overlong = vec![wire::TAG, 0x80, 0x00];
        overlong.extend_from_slice(&good[2..]);
        assert_eq!(wire::decode(&overlong), None, "overlong");
        // An unreduced rate (2/2) and an impossible state are refused.
        let mut unreduced = vec![wire::TAG, 0, 0, 2, 2, 5, 0];
        assert_eq!(wire::decode(&unreduced), None, "unreduced rate");
        unreduced[3] = 1;
        unreduced[4] = 1;
        assert!(wire::decode(&unreduced).is_some(), "same state, reduced");
        let mut over = b;
        over.tokens = over.cap_nanos() + 1;
        let len = wire::encode(&over, at, &mut buf);
        assert_eq!(wire::decode(&buf[..len]), None, "tokens above capacity");
        // 64-bit fields must fit.
        let mut huge = vec![wire::TAG, 0, 0, 1, 1];
        huge.extend_from_slice(&[0xff; 9]);
        huge.extend_from_slice(&[0x7f, 0]);
        assert_eq!(wire::decode(&huge), None, "capacity above 64 bits");
    }

    #[test]
    fn realistic_buckets_pack_into_32_bytes() {
        let now = 1_795_300_000_000_000;
        for (l, tokens) in [
            (lim(10, 1, 100), 98_140_000_123),
            (lim(5, 3, 500), -1_234 * NANOS),
            (lim(1, 86_400, 1_000_000), 0),
            (lim(1, 1_000_000_000_000, 10), 3),
            // Bytes: 1e9/s, a burst of 1e15, in debt by a day of refill.
            (
                lim(1_000_000_000, 1, 1_000_000_000_000_000),
                -86_400_000_000_000 * NANOS,
            ),
            (
                lim(MAX_RATE_NUM as u128, 1, MAX_AMOUNT),
                MAX_AMOUNT as i128 * NANOS,
            ),
            (lim(0, 1, MAX_AMOUNT), MAX_AMOUNT as i128 * NANOS),
            (lim(7, MAX_RATE_DEN as u128, MAX_AMOUNT), -1),
        ] {
            let b = Bucket {
                tokens,
                ..Bucket::full(l, now)
            };
            let words = packed::pack(&b).unwrap_or_else(|| panic!("{b:?} does not pack"));
            assert_eq!(packed::unpack(&words), b);
            assert_eq!(packed::unpack_checked(&words), Some(b));
            assert_eq!(words[0] & 1, 0);
        }
        // The extremes do not pack: the glue holds them in the wide form.
        let deep = Bucket {
            tokens: -MAX_DEBT_NANOS + 1,
            ..Bucket::full(
                lim(
                    MAX_RATE_NUM as u128 - 1,
                    MAX_RATE_DEN as u128 - 1,
                    MAX_AMOUNT,
                ),
                now,
            )
        };
        assert_eq!(packed::pack(&deep), None);
        let before_1970 = Bucket::full(lim(1, 1, 1), -1);
        assert_eq!(packed::pack(&before_1970), None);
        let after_2112 = Bucket::full(lim(1, 1, 1), 1 << 52);
        assert_eq!(packed::pack(&after_2112), None);
    }

    #[test]
    fn rdb_v1_fields_load_and_are_checked() {
        let b = Bucket {
            tokens: -7 * NANOS - 3,
            ..Bucket::full(lim(5, 3, 10), -12)
        };
        let f = rdb_v1::encode(&b);
        assert_eq!(rdb_v1::decode(f), Some(b));
        // Version 1 reduced the rate when loading.
        let mut unreduced = f;
        unreduced[3] *= 4;
        unreduced[4] *= 4;
        assert_eq!(rdb_v1::decode(unreduced), Some(b));
        let mut over = f;
        over[0] = (11 * NANOS) as u64;
        over[1] = 0;
        assert_eq!(rdb_v1::decode(over), None, "tokens above capacity");
        let mut zero_den = f;
        zero_den[4] = 0;
        assert_eq!(rdb_v1::decode(zero_den), None);
        let mut b2 = [0u8; rdb_v2::MAX_LEN];
        let len = rdb_v2::encode(&b, &mut b2);
        assert_eq!(rdb_v2::decode(&b2[..len]), Some(b));
        let mut w = [0u8; wire::MAX_LEN];
        let len = wire::encode(&b, 5, &mut w);
        assert_eq!(
            rdb_v2::decode(&w[..len]),
            None,
            "an RDB payload carries no expiry"
        );
    }

    #[test]
    fn states_with_leases_round_trip_and_the_older_tag_still_loads() {
        use crate::lease::{Lease, Leases};
        let b = Bucket {
            tokens: 3 * NANOS,
            ..Bucket::full(lim(0, 1, 10), 1_795_238_169_873_123)
        };
        let lease = |id, n, expires_us, keep| Lease {
            id,
            n,
            expires_us,
            keep,
        };
        let leases = Leases::new(vec![lease(77, 4, 5_000, true), lease(3, 3, 9_000, false)]);
        let mut buf = Vec::new();
        wire::encode_state(&b, &leases, 42, &mut buf);
        assert_eq!(buf[0], wire::TAG_LEASES);
        assert_eq!(wire::decode_state(&buf), Some((b, leases.clone(), 42)));
        // Out of expiry order, a repeated id, or id 0: refused.
        for bad in [
            vec![lease(3, 3, 9_000, false), lease(77, 4, 5_000, true)],
            vec![lease(3, 3, 5_000, false), lease(3, 4, 9_000, true)],
            vec![lease(0, 3, 5_000, false)],
        ] {
            let mut out = Vec::new();
            wire::encode_state(&b, &Leases::new(bad), 0, &mut out);
            assert_eq!(wire::decode_state(&out), None);
        }
        // Tag 2 (ids from the clock, a last id, leases by id, none kept):
        // loaded with the last id dropped and the leases by expiry.
        let mut head = [0u8; wire::MAX_LEN];
        let len = wire::encode(&b, 0, &mut head);
        let mut v2 = head[..len].to_vec();
        v2[0] = wire::TAG_LEASES_V2;
        // last_id 9, two leases: (5, 2, expires 800) and (9, 1, expires 700).
        v2.extend_from_slice(&[9, 2, 5, 2, 0xc0, 0x0c, 9, 1, 0xf8, 0x0a]);
        let (got, held, at) = wire::decode_state(&v2).unwrap();
        assert_eq!((got, at), (b, 0));
        assert_eq!(
            held.held,
            vec![lease(9, 1, 700, false), lease(5, 2, 800, false)]
        );
        // A change to the leases round-trips, in a few bytes.
        let d = crate::lease::Delta {
            expired_through: Some(1_795_238_169_873_123),
            released: vec![77],
            granted: vec![lease(5, 2, 1_795_238_229_873_123, true)],
            held_after: 1_000,
        };
        let mut out = Vec::new();
        wire::encode_delta(&b, &d, 42, &mut out);
        assert!(out.len() < 60, "{} bytes", out.len());
        assert_eq!(wire::decode_delta(&out), Some((b, d, 42)));
        assert_eq!(wire::decode_state(&out), None, "a change is no state");
        // A tag 2 state whose leases were all gone: the bucket alone.
        let mut none = head[..len].to_vec();
        none[0] = wire::TAG_LEASES_V2;
        none.extend_from_slice(&[9, 0]);
        assert_eq!(
            rdb_v2::decode_state(&none),
            Some((b, crate::lease::Leases::default()))
        );
    }

    proptest! {
        /// The wire form round-trips every valid state and expiry exactly.
        #[test]
        fn wire_state_round_trips(
            b in arb_bucket(),
            at in prop_oneof![Just(0i64), 1i64..(1i64 << 53), 1i64..i64::MAX],
        ) {
            let mut buf = [0u8; wire::MAX_LEN];
            let len = wire::encode(&b, at, &mut buf);
            prop_assert_eq!(wire::decode(&buf[..len]), Some((b, at)));
        }

        /// Decoding arbitrary bytes never panics, and whatever it accepts
        /// re-encodes to the same bytes.
        #[test]
        fn wire_decode_is_canonical(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut input = bytes.clone();
            input.insert(0, wire::TAG);
            if let Some((b, at)) = wire::decode(&input) {
                let mut buf = [0u8; wire::MAX_LEN];
                let len = wire::encode(&b, at, &mut buf);
                prop_assert_eq!(&buf[..len], &input[..]);
            }
        }


        /// Every valid state round-trips through the packed form when it
        /// fits, and through RDB version 1 and 2.
        #[test]
        fn packed_and_rdb_round_trip(b in arb_bucket()) {
            if let Some(words) = packed::pack(&b) {
                prop_assert_eq!(packed::unpack(&words), b);
                prop_assert_eq!(packed::unpack_checked(&words), Some(b));
            }
            prop_assert_eq!(rdb_v1::decode(rdb_v1::encode(&b)), Some(b));
            let mut buf = [0u8; rdb_v2::MAX_LEN];
            let len = rdb_v2::encode(&b, &mut buf);
            prop_assert_eq!(rdb_v2::decode(&buf[..len]), Some(b));
        }

        /// Every state within the documented bounds packs into 32 bytes.
        #[test]
        fn states_within_the_bounds_pack(
            num in prop_oneof![0u64..=1000, 0u64..=packed::FITS.2],
            den in prop_oneof![1u64..=86_400, 1u64..=packed::FITS.3],
            capacity in prop_oneof![0u64..=1000, 0u64..=packed::FITS.0],
            level in 0.0f64..=1.0,
            debt in prop_oneof![0u64..=10, 0u64..=packed::FITS.1],
            updated_us in prop_oneof![1_700_000_000_000_000i64..1_900_000_000_000_000, 0i64..(1 << 52)],
            nanos in 0i128..NANOS,
        ) {
            let rate = Rate::new(num.into(), den.into()).unwrap();
            let mut b = Bucket::full(Limits { rate, capacity }, updated_us);
            b.tokens = ((capacity as f64 * level) as i128 - debt as i128) * NANOS + nanos;
            b.tokens = b.tokens.min(b.cap_nanos());
            let words = packed::pack(&b);
            prop_assert!(words.is_some(), "{:?} does not pack", b);
            prop_assert_eq!(packed::unpack(&words.unwrap()), b);
        }

        /// Arbitrary words either are exactly the packed form of a valid
        /// bucket, or are refused; unpacking them never panics.
        #[test]
        fn packed_decode_is_canonical(words in any::<[u64; 4]>()) {
            let _ = packed::unpack(&words);
            if let Some(b) = packed::unpack_checked(&words) {
                prop_assert_eq!(packed::pack(&b), Some(words));
            }
        }
    }
}
