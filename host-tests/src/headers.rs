//! Header maps and the proxy-wasm pair serialization format.
//!
//! Format (little endian): `u32 count`, then `count` x (`u32 key_len`, `u32 value_len`),
//! then for each pair `key \0 value \0`.

/// An ordered multi-map of headers. Keys are stored lower-cased (as Envoy does with
/// `LowerCaseString`); lookups are case-insensitive. Values are raw bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderMap {
    pairs: Vec<(String, Vec<u8>)>,
}

impl HeaderMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_pairs<K: AsRef<str>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Self {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.add(k.as_ref(), v.as_ref());
        }
        m
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// First value of `key`, as bytes.
    pub fn get_bytes(&self, key: &str) -> Option<&[u8]> {
        let key = key.to_ascii_lowercase();
        self.pairs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_slice())
    }

    /// First value of `key` (lossy UTF-8).
    pub fn get(&self, key: &str) -> Option<String> {
        self.get_bytes(key)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// All values of `key`.
    pub fn get_all(&self, key: &str) -> Vec<String> {
        let key = key.to_ascii_lowercase();
        self.pairs
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    pub fn add(&mut self, key: &str, value: &[u8]) {
        self.pairs.push((key.to_ascii_lowercase(), value.to_vec()));
    }

    /// Replace the first occurrence in place and drop the others; append if absent.
    pub fn replace(&mut self, key: &str, value: &[u8]) {
        let key = key.to_ascii_lowercase();
        let mut seen = false;
        self.pairs.retain_mut(|(k, v)| {
            if *k != key {
                return true;
            }
            if seen {
                return false;
            }
            seen = true;
            *v = value.to_vec();
            true
        });
        if !seen {
            self.pairs.push((key, value.to_vec()));
        }
    }

    pub fn remove(&mut self, key: &str) {
        let key = key.to_ascii_lowercase();
        self.pairs.retain(|(k, _)| *k != key);
    }

    pub fn pairs(&self) -> &[(String, Vec<u8>)] {
        &self.pairs
    }

    /// Pairs as lossy UTF-8 strings.
    pub fn to_vec(&self) -> Vec<(String, String)> {
        self.pairs
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect()
    }

    pub fn serialize(&self) -> Vec<u8> {
        serialize_pairs(self.pairs.iter().map(|(k, v)| (k.as_bytes(), v.as_slice())))
    }

    /// Parse the serialized pair format into a map (keys as lossy UTF-8); `None` if it does
    /// not parse.
    pub fn deserialize(bytes: &[u8]) -> Option<HeaderMap> {
        let mut m = HeaderMap::new();
        for (k, v) in deserialize_pairs(bytes)? {
            m.add(&String::from_utf8_lossy(&k), &v);
        }
        Some(m)
    }
}

pub fn serialize_pairs<'a>(pairs: impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone) -> Vec<u8> {
    let n = pairs.clone().count();
    let mut out = Vec::new();
    out.extend_from_slice(&(n as u32).to_le_bytes());
    for (k, v) in pairs.clone() {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// Parse the serialized pair format. Returns `None` on any inconsistency
/// (the host then answers `BadArgument`/`SerializationFailure`).
pub fn deserialize_pairs(bytes: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let rd = |at: usize| -> Option<u32> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let n = rd(0)? as usize;
    let mut sizes = Vec::with_capacity(n.min(4096));
    let mut at = 4usize;
    for _ in 0..n {
        let k = rd(at)? as usize;
        let v = rd(at + 4)? as usize;
        sizes.push((k, v));
        at += 8;
    }
    let mut out = Vec::with_capacity(n.min(4096));
    for (k, v) in sizes {
        let key = bytes.get(at..at.checked_add(k)?)?.to_vec();
        at += k;
        if *bytes.get(at)? != 0 {
            return None;
        }
        at += 1;
        let val = bytes.get(at..at.checked_add(v)?)?.to_vec();
        at += v;
        if *bytes.get(at)? != 0 {
            return None;
        }
        at += 1;
        out.push((key, val));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let m = HeaderMap::from_pairs(&[(":path", "/x"), ("X-A", "1"), ("x-a", "2")]);
        let ser = m.serialize();
        let back = deserialize_pairs(&ser).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[1], (b"x-a".to_vec(), b"1".to_vec()));
        assert_eq!(m.get("X-a").as_deref(), Some("1"));
        assert_eq!(m.get_all("x-a"), vec!["1", "2"]);
    }

    #[test]
    fn replace_and_remove() {
        let mut m = HeaderMap::from_pairs(&[("a", "1"), ("b", "2"), ("a", "3")]);
        m.replace("A", b"9");
        assert_eq!(
            m.to_vec(),
            vec![("a".into(), "9".into()), ("b".into(), "2".into())]
        );
        m.replace("c", b"4");
        assert_eq!(m.len(), 3);
        m.remove("a");
        assert_eq!(m.get("a"), None);
    }

    #[test]
    fn malformed_is_rejected() {
        assert!(deserialize_pairs(&[1, 0, 0, 0]).is_none());
        assert!(
            deserialize_pairs(&[1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, b'a', 1, b'b', 0]).is_none()
        );
        assert_eq!(deserialize_pairs(&[]), Some(vec![]));
    }
}
