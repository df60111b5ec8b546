//! The inputs of IM-bench v1 (design brief section 5), as pure functions of
//! a seed: payloads, which group each message goes to, cursors, ACK moves,
//! memberships and queries. `tidemark bench` and the peer comparison
//! (benches/compare) both draw from here, so every system gets the same
//! bytes and the same work.
//!
//! Values that a connection needs by index (the group of message `i`) come
//! from a keyed hash rather than a running generator, so connections can
//! split the work without sharing state; sequences whose every step depends
//! on the previous one (W3's cursor moves) are generated once, in order.

/// The seed every workload uses unless told otherwise ("tidemark" in ASCII).
pub const SEED_DEFAULT: u64 = 0x7469_6465_6d61_726b;
/// Distinct random payloads cycled through by the sends.
pub const PAYLOADS: usize = 1024;
/// Senders of W1 and W4's messages: message `i` comes from user
/// `1 + i % SENDERS` with `client_msg_id = i + 1`.
pub const SENDERS: u64 = 1000;
/// Largest step of one W3 ACK: it moves a cursor forward by 1 to this many.
pub const W3_STEP_MAX: u64 = 16;

// Sub-seeds: one stream of randomness per purpose, so changing one
// workload's parameters does not change another's inputs.
const TAG_PAYLOAD: u64 = 1;
const TAG_W1_GROUP: u64 = 2;
const TAG_W2_CURSOR: u64 = 3;
const TAG_W3_MOVES: u64 = 4;
const TAG_W4_GROUP: u64 = 5;
const TAG_W4_USER: u64 = 6;
const TAG_W4_QUERY: u64 = 7;
const TAG_MIXED: u64 = 8;

/// splitmix64: deterministic, fast, no dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        finalize(self.0)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is below 2^-40 for the
    /// sizes used here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A keyed hash of `(seed, tag, i)`: the `i`-th value of stream `tag`.
pub fn hash(seed: u64, tag: u64, i: u64) -> u64 {
    finalize(
        seed ^ finalize(tag.wrapping_mul(0xd6e8_feb8_6659_fd93))
            ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
    )
}

/// `PAYLOADS` payloads of `size` random bytes; message `i` carries
/// `payloads[i % PAYLOADS]`.
pub fn payloads(seed: u64, size: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(hash(seed, TAG_PAYLOAD, 0));
    (0..PAYLOADS)
        .map(|_| {
            let mut p = vec![0u8; size];
            for chunk in p.chunks_mut(8) {
                let r = rng.next_u64().to_le_bytes();
                chunk.copy_from_slice(&r[..chunk.len()]);
            }
            p
        })
        .collect()
}

/// Sender and `client_msg_id` of message `i` (W1, W4, mixed).
pub fn sender_of(i: u64) -> (u64, u64) {
    (1 + i % SENDERS, i + 1)
}

/// W1: the group (in `1..=groups`) of message `i`, uniform at random.
pub fn w1_group(seed: u64, groups: u64, i: u64) -> u64 {
    1 + hash(seed, TAG_W1_GROUP, i) % groups.max(1)
}

/// W2: member `m`'s cursor (members `1..=members`), uniform in
/// `[messages - messages / 10, messages)`: 90,000..100,000 at full size.
pub fn w2_cursor(seed: u64, messages: u64, member: u64) -> u64 {
    let low = messages - messages / 10;
    let span = (messages - low).max(1);
    (low + hash(seed, TAG_W2_CURSOR, member) % span).min(messages.saturating_sub(1))
}

/// W2: records delivered when every member pulls everything above its cursor.
pub fn w2_expected(seed: u64, messages: u64, members: u64) -> u64 {
    (1..=members)
        .map(|m| messages - w2_cursor(seed, messages, m))
        .sum()
}

/// W3: `acks` single ACKs in order, each `(member, msg_id)` moving a random
/// member's cursor (members `1..=members`, all starting at 0) forward by
/// 1..=`W3_STEP_MAX`, capped at `head`; and the cursors they leave.
pub fn w3_acks(seed: u64, members: u64, head: u64, acks: u64) -> (Vec<(u64, u64)>, Vec<u64>) {
    let mut rng = Rng::new(hash(seed, TAG_W3_MOVES, 0));
    let mut cursors = vec![0u64; members as usize];
    let mut out = Vec::with_capacity(acks as usize);
    for _ in 0..acks {
        let m = rng.below(members);
        let c = &mut cursors[m as usize];
        *c = (*c + 1 + rng.below(W3_STEP_MAX)).min(head);
        out.push((m + 1, *c));
    }
    (out, cursors)
}

/// W4's inputs: `users` users, each a member of `per_user` distinct groups
/// out of `groups`, `messages` messages spread uniformly over the groups,
/// every cursor uniform in `[0, head]`; queries ask for random users.
#[derive(Clone, Debug)]
pub struct W4Plan {
    pub seed: u64,
    pub users: u64,
    pub groups: u64,
    pub per_user: u64,
    pub messages: u64,
}

impl W4Plan {
    /// The group (in `1..=groups`) of stored message `i`.
    pub fn message_group(&self, i: u64) -> u64 {
        1 + hash(self.seed, TAG_W4_GROUP, i) % self.groups.max(1)
    }

    /// Every group's head after all messages are stored (index `group - 1`).
    pub fn heads(&self) -> Vec<u64> {
        let mut heads = vec![0u64; self.groups as usize];
        for i in 0..self.messages {
            heads[(self.message_group(i) - 1) as usize] += 1;
        }
        heads
    }

    /// User `u`'s memberships `(group, cursor)`, ascending group id.
    pub fn user_groups(&self, user: u64, heads: &[u64]) -> Vec<(u64, u64)> {
        let mut rng = Rng::new(hash(self.seed, TAG_W4_USER, user));
        let k = self.per_user.min(self.groups) as usize;
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(k);
        while out.len() < k {
            let g = 1 + rng.below(self.groups);
            if out.iter().any(|&(x, _)| x == g) {
                continue;
            }
            out.push((g, 0));
        }
        out.sort_unstable();
        for e in &mut out {
            e.1 = rng.below(heads[(e.0 - 1) as usize] + 1);
        }
        out
    }

    /// The user of query `i`.
    pub fn query_user(&self, i: u64) -> u64 {
        1 + hash(self.seed, TAG_W4_QUERY, i) % self.users.max(1)
    }
}

/// Zipf-distributed integers in `[low, high]`: P(k) proportional to 1/k^s.
pub struct Zipf {
    low: u64,
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(low: u64, high: u64, exponent: f64) -> Zipf {
        let high = high.max(low);
        let mut cdf = Vec::with_capacity((high - low + 1) as usize);
        let mut sum = 0.0;
        for k in low..=high {
            sum += 1.0 / (k as f64).powf(exponent);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf { low, cdf }
    }

    pub fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        let i = self.cdf.partition_point(|&c| c < u);
        self.low + i.min(self.cdf.len() - 1) as u64
    }
}

/// A generator for the mixed workload's choices.
pub fn mixed_rng(seed: u64) -> Rng {
    Rng::new(hash(seed, TAG_MIXED, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w2_cursors_cover_the_brief_range() {
        for m in 1..=2000 {
            let c = w2_cursor(SEED_DEFAULT, 100_000, m);
            assert!((90_000..100_000).contains(&c));
        }
        assert_eq!(w2_cursor(SEED_DEFAULT, 1, 1), 0);
    }

    #[test]
    fn w3_moves_are_forward_and_capped() {
        let (acks, cursors) = w3_acks(1, 10, 50, 1000);
        let mut model = [0u64; 10];
        for (m, to) in acks {
            assert!(to >= model[(m - 1) as usize] && to <= 50);
            model[(m - 1) as usize] = to;
        }
        assert_eq!(&model[..], &cursors[..]);
    }

    #[test]
    fn w4_memberships_are_distinct_and_within_heads() {
        let p = W4Plan {
            seed: 3,
            users: 10,
            groups: 60,
            per_user: 50,
            messages: 1000,
        };
        let heads = p.heads();
        assert_eq!(heads.iter().sum::<u64>(), 1000);
        let g = p.user_groups(7, &heads);
        assert_eq!(g.len(), 50);
        assert!(g.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(g.iter().all(|&(g, c)| c <= heads[(g - 1) as usize]));
        assert_eq!(g, p.user_groups(7, &heads));
    }

    #[test]
    fn zipf_stays_in_range_and_favours_small_values() {
        let z = Zipf::new(2, 1000, 1.0);
        let mut rng = Rng::new(9);
        let v: Vec<u64> = (0..10_000).map(|_| z.sample(&mut rng)).collect();
        assert!(v.iter().all(|&x| (2..=1000).contains(&x)));
        let small = v.iter().filter(|&&x| x < 10).count();
        assert!(small > 2_000, "{small}");
    }
}
