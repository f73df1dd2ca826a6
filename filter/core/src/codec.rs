//! Little-endian fixed-width fields: the one codec of every record kept in
//! shared data (the ledger, health, the index log's events, the lease).
//!
//! Records are written field by field with [`put`] and read back in the same
//! order with a [`Reader`]; a record too short for its fields reads as `None`,
//! so a value written by another layout (another release, another fleet size)
//! is rejected by its decoder, never misread.

/// A value with a fixed little-endian encoding.
pub trait Field: Sized + Copy {
    /// Appends the encoding to `out`.
    fn put(self, out: &mut Vec<u8>);
    /// Decodes from the front of `bytes`, returning the rest.
    fn take(bytes: &[u8]) -> Option<(Self, &[u8])>;
}

macro_rules! le_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn take(bytes: &[u8]) -> Option<(Self, &[u8])> {
                let (head, rest) = bytes.split_first_chunk()?;
                Some((<$t>::from_le_bytes(*head), rest))
            }
        }
    )*};
}

le_field!(u8, u16, u32, u64, f64);

/// Appends `v` to a record.
pub fn put<T: Field>(out: &mut Vec<u8>, v: T) {
    v.put(out);
}

/// Reads a record's fields in order.
#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { rest: bytes }
    }

    /// The next field; `None` when the record is too short.
    pub fn get<T: Field>(&mut self) -> Option<T> {
        let (v, rest) = T::take(self.rest)?;
        self.rest = rest;
        Some(v)
    }

    /// What has not been read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    /// The next `len` bytes as they are; `None` when the record is too short.
    pub fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.rest.split_at_checked(len)?;
        self.rest = rest;
        Some(head)
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// A record holding a single `u64` (counters, sequence numbers); anything
/// else, a missing value included, reads as 0.
pub fn u64_value(bytes: Option<&[u8]>) -> u64 {
    bytes
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn fields_round_trip_in_order() {
        let mut out = Vec::new();
        put(&mut out, 7u8);
        put(&mut out, 0xbeefu16);
        put(&mut out, u32::MAX);
        put(&mut out, 1u64 << 40);
        put(&mut out, -2.5f64);
        assert_eq!(out.len(), 1 + 2 + 4 + 8 + 8);
        let mut r = Reader::new(&out);
        assert_eq!(r.get::<u8>(), Some(7));
        assert_eq!(r.get::<u16>(), Some(0xbeef));
        assert_eq!(r.get::<u32>(), Some(u32::MAX));
        assert_eq!(r.get::<u64>(), Some(1 << 40));
        assert_eq!(r.get::<f64>(), Some(-2.5));
        assert!(r.rest().is_empty());
        assert_eq!(r.get::<u8>(), None, "past the end");
    }

    #[test]
    fn a_short_record_reads_as_none() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.get::<u32>(), None);
        assert_eq!(
            r.get::<u16>(),
            Some(0x0201),
            "a failed read consumes nothing"
        );
        assert_eq!(u64_value(Some(&[1, 0, 0, 0, 0, 0, 0, 0])), 1);
        assert_eq!(u64_value(Some(&[1, 0])), 0);
        assert_eq!(u64_value(None), 0);
    }
}
