//! Redis Cluster's hash slot of a key: which master owns it.

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag, modulo
/// 16384. The hash tag is what lies between the first `{` and the first `}` after it, when that is
/// not empty; keys with the same tag share a slot, so one script may touch them all.
///
/// ```
/// use tollgate_redis::slot;
///
/// assert_eq!(slot(b"foo"), 12182);
/// assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
/// ```
pub fn slot(key: &[u8]) -> u16 {
    crc16(hashed_part(key)) % SLOTS
}

/// The part of `key` the slot is computed from: its hash tag if it has a non-empty one.
fn hashed_part(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    match key[open + 1..].iter().position(|&b| b == b'}') {
        Some(0) | None => key,
        Some(len) => &key[open + 1..open + 1 + len],
    }
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_check_value_and_redis_examples() {
        // The CRC catalogue's check value for CRC-16/XMODEM.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{foo}bar"), slot(b"foo"));
        assert_eq!(slot(b"a{foo}b{bar}"), slot(b"foo"));
        assert_eq!(slot(b"{}foo"), crc16(b"{}foo") % SLOTS);
        assert_eq!(slot(b"foo{"), crc16(b"foo{") % SLOTS);
        assert_eq!(slot(b"{{a}}"), slot(b"{a"));
    }
}
