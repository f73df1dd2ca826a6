//! A validating JSON reader over a request body that copies nothing: values
//! are spans of the body, and a string's escapes are found once, while the
//! body is checked, so its text can later be fed out in runs.
//!
//! Why not serde_json: to hash a 128 KB prompt, serde scans each string for
//! escapes, copies the runs between them into a scratch buffer, and hands the
//! text over to be copied again and scanned for separator bytes before the
//! hasher copies it a third time. Here one scan validates the string and
//! records where its escapes are ([`Str`]); [`Str::decode`] then feeds the
//! runs between them straight from the body. The canonical stream is
//! serde's, so hashes agree with every JSON encoder (the property tests in
//! `openai`, and its differential test against serde's reading).
//!
//! The string scan tests eight bytes per step (SWAR) for `"`, `\` or a byte
//! below 0x20, and ORs the words it reads: a string with no byte ≥ 0x80 is
//! ASCII, hence UTF-8, and skips `str::from_utf8`.
//!
//! What is accepted is RFC 8259's JSON text, with three limits:
//! - nesting deeper than [`MAX_DEPTH`] in the whole body is an error (the
//!   reader recurses: a hostile body cannot exhaust the stack); serde_json
//!   skips a value it does not read at any depth;
//! - a `\u` escape of a lone surrogate is an error in a string that is read
//!   ([`JsonReader::string`], keys included), as in serde_json: it decodes to no
//!   character, so no text can be hashed. A skipped value may hold one;
//! - invalid UTF-8 is an error anywhere, inside a string or not (serde_json
//!   does not check a string it skips; such a body is not JSON, and the
//!   backend would refuse it).
//!
//! Numbers are checked against the grammar only: their value is never read
//! here (serde_json's `Value` refuses one out of `f64`'s range).
//!
//! Cost: one pass over the body (8 bytes a step in strings), plus
//! `from_utf8` over the strings that hold non-ASCII bytes; 4 bytes of escape
//! offsets per escape in a string read with [`JsonReader::string`].

/// Deepest nesting of arrays and objects accepted.
pub const MAX_DEPTH: usize = 128;

/// Why the body is not JSON (the reader does not say where: the filter
/// counts it as a fallback reason and routes the request anyway).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syntax;

/// A string in the body, checked: its bytes between the quotes, and where
/// its escapes are in the reader's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Str<'a> {
    /// The bytes between the quotes (valid UTF-8; escapes undecoded).
    pub raw: &'a [u8],
    escapes: (usize, usize),
}

impl<'a> Str<'a> {
    /// Whether the string has escapes (its text is not its raw bytes).
    pub fn is_escaped(&self) -> bool {
        self.escapes.0 != self.escapes.1
    }

    /// Feeds the decoded text in order: the raw runs between escapes, and
    /// the character of each escape. `offsets` are the reader's
    /// ([`JsonReader::offsets`]).
    pub fn decode(&self, offsets: &[u32], mut piece: impl FnMut(Piece<'a>)) {
        let mut at = 0;
        let escapes = offsets
            .get(self.escapes.0..self.escapes.1)
            .unwrap_or_default();
        // The offsets were checked when read: `get` only keeps a wrong
        // `offsets` from panicking.
        let run = |from: usize, to: usize| self.raw.get(from..to).unwrap_or_default();
        for &e in escapes {
            let e = e as usize;
            if e > at {
                piece(Piece::Run(run(at, e)));
            }
            let (c, len) = unescape(run(e, self.raw.len()));
            piece(Piece::Char(c));
            at = e + len;
        }
        if at < self.raw.len() {
            piece(Piece::Run(run(at, self.raw.len())));
        }
    }

    /// The decoded text, borrowed when it has no escapes (short strings: keys,
    /// roles, the model).
    pub fn text(&self, offsets: &[u32]) -> std::borrow::Cow<'a, str> {
        use std::borrow::Cow;
        if !self.is_escaped() {
            // Checked when read; never fails.
            return Cow::Borrowed(std::str::from_utf8(self.raw).unwrap_or_default());
        }
        let mut s = Vec::with_capacity(self.raw.len());
        self.decode(offsets, |p| match p {
            Piece::Run(r) => s.extend_from_slice(r),
            Piece::Char(c) => s.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        });
        Cow::Owned(String::from_utf8(s).unwrap_or_default())
    }
}

/// A piece of a string's text: a run of its raw bytes, or an escape's character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    Run(&'a [u8]),
    Char(char),
}

/// The character a checked escape spells, and how many bytes it spans.
fn unescape(e: &[u8]) -> (char, usize) {
    let simple = |c| (c, 2);
    match e.get(1) {
        Some(b'n') => simple('\n'),
        Some(b't') => simple('\t'),
        Some(b'r') => simple('\r'),
        Some(b'b') => simple('\u{8}'),
        Some(b'f') => simple('\u{c}'),
        Some(b'u') => {
            let unit = hex4(e.get(2..6)).unwrap_or(0xfffd);
            if (0xd800..0xdc00).contains(&unit) {
                let low = hex4(e.get(8..12)).unwrap_or(0xdc00);
                let c = 0x10000 + ((unit - 0xd800) << 10) + low.saturating_sub(0xdc00);
                (char::from_u32(c).unwrap_or('\u{fffd}'), 12)
            } else {
                (char::from_u32(unit).unwrap_or('\u{fffd}'), 6)
            }
        }
        // `"`, `\`, `/`: the byte itself.
        Some(&b) => simple(char::from(b)),
        None => simple('\u{fffd}'),
    }
}

/// Four hex digits as a UTF-16 unit.
fn hex4(d: Option<&[u8]>) -> Option<u32> {
    d?.iter().try_fold(0u32, |v, &b| {
        let digit = char::from(b).to_digit(16)?;
        Some(v << 4 | digit)
    })
}

const ONES: u64 = u64::MAX / 255;
const HIGH: u64 = ONES * 0x80;

/// Bit 7 of each lane that is `"`, `\` or below 0x20. Only the lowest set
/// lane is exact (a borrow may flag lanes above a true one): that is the one
/// the scan stops at.
fn special(x: u64) -> u64 {
    let zero = |v: u64| v.wrapping_sub(ONES) & !v;
    (zero(x ^ (ONES * u64::from(b'"')))
        | zero(x ^ (ONES * u64::from(b'\\')))
        | (x.wrapping_sub(ONES * 0x20) & !x))
        & HIGH
}

/// The bytes before the first `"`, `\` or byte below 0x20 in `rest`: their
/// length, the byte that stops them (none: the body ended), and the OR of
/// the words read (at least those bytes; a byte ≥ 0x80 among them sets bit 7
/// of some lane). Eight bytes a step, on locals: this loop is most of the
/// reader's time on a long prompt.
fn to_special(rest: &[u8]) -> (usize, Option<u8>, u64) {
    let mut any = 0;
    let mut words = rest.chunks_exact(8);
    for (i, w) in words.by_ref().enumerate() {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        let x = u64::from_le_bytes(word);
        any |= x;
        let s = special(x);
        if s != 0 {
            let lane = (s.trailing_zeros() / 8) as usize;
            return (8 * i + lane, Some(w[lane]), any);
        }
    }
    let done = rest.len() - words.remainder().len();
    for (i, &c) in words.remainder().iter().enumerate() {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return (done + i, Some(c), any);
        }
        any |= u64::from(c);
    }
    (rest.len(), None, any)
}

/// A cursor over a body, validating as it goes.
pub struct JsonReader<'a> {
    b: &'a [u8],
    pos: usize,
    depth: usize,
    /// Where the escapes of strings read with [`JsonReader::string`] are, as
    /// offsets into their raw bytes (a range of this per string).
    offsets: Vec<u32>,
}

impl<'a> JsonReader<'a> {
    pub fn new(body: &'a [u8]) -> JsonReader<'a> {
        JsonReader {
            b: body,
            pos: 0,
            depth: 0,
            offsets: Vec::new(),
        }
    }

    /// The escape offsets that [`Str::decode`] needs.
    pub fn offsets(&self) -> &[u32] {
        &self.offsets
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.pos) {
            self.pos += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    pub fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.pos).copied()
    }

    fn eat(&mut self, c: u8) -> Result<(), Syntax> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Syntax)
        }
    }

    /// Only whitespace is left.
    pub fn end(&mut self) -> Result<(), Syntax> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(Syntax),
        }
    }

    fn enter(&mut self, open: u8) -> Result<(), Syntax> {
        self.eat(open)?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Syntax);
        }
        Ok(())
    }

    /// Starts an object; then call [`JsonReader::key`] until it returns `None`.
    pub fn object(&mut self) -> Result<(), Syntax> {
        self.enter(b'{')
    }

    /// The next key of the object (its value follows), or `None` at its end.
    /// `first` is whether no key was read yet.
    pub fn key(&mut self, first: bool) -> Result<Option<Str<'a>>, Syntax> {
        self.next_key(first, true)
    }

    /// [`JsonReader::key`]; `decoded`: whether the key will be decoded (see
    /// [`JsonReader::scan_string`]; the keys of a skipped object are not).
    fn next_key(&mut self, first: bool, decoded: bool) -> Result<Option<Str<'a>>, Syntax> {
        if !self.more(first, b'}')? {
            return Ok(None);
        }
        let k = self.scan_string(decoded)?;
        self.eat(b':')?;
        Ok(Some(k))
    }

    /// Starts an array; then call [`JsonReader::element`] until it returns false.
    pub fn array(&mut self) -> Result<(), Syntax> {
        self.enter(b'[')
    }

    /// Whether another element follows (positioned at it), or the array ended.
    pub fn element(&mut self, first: bool) -> Result<bool, Syntax> {
        self.more(first, b']')
    }

    /// Whether another member of the container follows (positioned at it,
    /// past its comma unless `first`), or the container ended at `close`.
    fn more(&mut self, first: bool, close: u8) -> Result<bool, Syntax> {
        if self.peek() == Some(close) {
            self.pos += 1;
            self.depth = self.depth.saturating_sub(1);
            return Ok(false);
        }
        if !first {
            self.eat(b',')?;
        }
        Ok(true)
    }

    /// A string, checked, its escapes recorded for [`Str::decode`]; a lone
    /// surrogate escape is an error (it decodes to no character).
    pub fn string(&mut self) -> Result<Str<'a>, Syntax> {
        self.scan_string(true)
    }

    /// A string; `decoded`: it will be decoded, so a lone surrogate escape is
    /// an error. A skipped string may hold one, as JSON's grammar allows.
    fn scan_string(&mut self, decoded: bool) -> Result<Str<'a>, Syntax> {
        self.eat(b'"')?;
        let start = self.pos;
        let first = self.offsets.len();
        let mut any = 0u64;
        loop {
            let (len, c, seen) = to_special(self.b.get(self.pos..).unwrap_or_default());
            any |= seen;
            self.pos += len;
            let c = c.ok_or(Syntax)?;
            match c {
                b'"' => break,
                b'\\' => {
                    let at = u32::try_from(self.pos - start).map_err(|_| Syntax)?;
                    self.offsets.push(at);
                    self.pos += escape_len(&self.b[self.pos..], decoded)?;
                }
                _ => return Err(Syntax),
            }
        }
        let raw = &self.b[start..self.pos];
        self.pos += 1;
        if any & HIGH != 0 {
            std::str::from_utf8(raw).map_err(|_| Syntax)?;
        }
        Ok(Str {
            raw,
            escapes: (first, self.offsets.len()),
        })
    }

    /// Skips one value, checked, and returns its bytes (no surrounding whitespace).
    pub fn value(&mut self) -> Result<&'a [u8], Syntax> {
        self.ws();
        let (start, recorded) = (self.pos, self.offsets.len());
        match self.b.get(self.pos).ok_or(Syntax)? {
            b'"' => {
                self.scan_string(false)?;
            }
            b'{' => {
                self.enter(b'{')?;
                let mut first = true;
                while self.next_key(first, false)?.is_some() {
                    self.value()?;
                    first = false;
                }
            }
            b'[' => {
                self.array()?;
                let mut first = true;
                while self.element(first)? {
                    self.value()?;
                    first = false;
                }
            }
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            _ => self.number()?,
        }
        // A skipped value's escapes are never decoded.
        self.offsets.truncate(recorded);
        Ok(&self.b[start..self.pos])
    }

    /// Whether the next value is `null` (consumed if so).
    pub fn null(&mut self) -> Result<bool, Syntax> {
        if self.peek() == Some(b'n') {
            self.literal(b"null")?;
            return Ok(true);
        }
        Ok(false)
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Syntax> {
        if self.b.get(self.pos..self.pos + word.len()) != Some(word) {
            return Err(Syntax);
        }
        self.pos += word.len();
        Ok(())
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Result<(), Syntax> {
        let digits = |r: &mut Self| {
            let from = r.pos;
            while r.b.get(r.pos).is_some_and(u8::is_ascii_digit) {
                r.pos += 1;
            }
            if r.pos == from {
                Err(Syntax)
            } else {
                Ok(())
            }
        };
        if self.b.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        if self.b.get(self.pos) == Some(&b'0') {
            self.pos += 1;
        } else {
            digits(self)?;
        }
        if self.b.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            digits(self)?;
        }
        if let Some(b'e' | b'E') = self.b.get(self.pos) {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.b.get(self.pos) {
                self.pos += 1;
            }
            digits(self)?;
        }
        Ok(())
    }
}

/// Length of the escape at the start of `e` (which begins with `\`), checked:
/// a known escape, four hex digits after `\u`, and, when `decoded`, a
/// surrogate only in a pair.
fn escape_len(e: &[u8], decoded: bool) -> Result<usize, Syntax> {
    match e.get(1).ok_or(Syntax)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Ok(2),
        b'u' => {
            let unit = hex4(e.get(2..6)).ok_or(Syntax)?;
            if !decoded {
                return Ok(6);
            }
            match unit {
                0xd800..=0xdbff => {
                    if e.get(6..8) != Some(b"\\u") {
                        return Err(Syntax);
                    }
                    match hex4(e.get(8..12)).ok_or(Syntax)? {
                        0xdc00..=0xdfff => Ok(12),
                        _ => Err(Syntax),
                    }
                }
                0xdc00..=0xdfff => Err(Syntax),
                _ => Ok(6),
            }
        }
        _ => Err(Syntax),
    }
}

/// Checks that `body` is one JSON value, whitespace around it.
pub fn validate(body: &[u8]) -> Result<(), Syntax> {
    let mut r = JsonReader::new(body);
    r.value()?;
    r.end()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn text(body: &str) -> Result<String, Syntax> {
        let mut r = JsonReader::new(body.as_bytes());
        let s = r.string()?;
        r.end()?;
        Ok(s.text(r.offsets()).into_owned())
    }

    #[test]
    fn the_word_scan_stops_where_a_byte_loop_does() {
        // Every byte value in every lane, among neighbours just outside the classes.
        for at in 0..8 {
            for b in 0..=255u8 {
                for fill in [0x20u8, 0x21, 0x5b, 0x5d, 0xff] {
                    let mut lanes = [fill; 8];
                    lanes[at] = b;
                    let naive = lanes
                        .iter()
                        .position(|&c| c == b'"' || c == b'\\' || c < 0x20);
                    let s = special(u64::from_le_bytes(lanes));
                    let found = (s != 0).then(|| (s.trailing_zeros() / 8) as usize);
                    assert_eq!(found, naive, "lanes {lanes:x?}");
                }
            }
        }
        // Two specials: the lower one is found, whatever borrows the first makes.
        for (i, j) in [(0, 1), (2, 7), (3, 4)] {
            for (x, y) in [(0u8, b'"'), (b'\\', 0x1f), (b'"', b'"'), (0x00, 0x00)] {
                let mut lanes = [b'a'; 8];
                lanes[i] = x;
                lanes[j] = y;
                assert_eq!(
                    special(u64::from_le_bytes(lanes)).trailing_zeros() / 8,
                    i as u32
                );
            }
        }
    }

    #[test]
    fn strings_decode_every_escape() {
        assert_eq!(text(r#""plain""#).as_deref(), Ok("plain"));
        assert_eq!(
            text(r#""\"\\\/\b\f\n\r\t""#).as_deref(),
            Ok("\"\\/\u{8}\u{c}\n\r\t")
        );
        assert_eq!(
            text(r#""a\u00e9b\ud83d\ude00c\u0000""#).as_deref(),
            Ok("a\u{e9}b\u{1f600}c\u{0}")
        );
        // Long runs between escapes, across word boundaries.
        let long = format!("\"{}\\n{}\"", "x".repeat(13), "\u{e9}".repeat(9));
        assert_eq!(
            text(&long),
            Ok(format!("{}\n{}", "x".repeat(13), "\u{e9}".repeat(9)))
        );
    }

    #[test]
    fn bad_strings_are_syntax_errors() {
        for bad in [
            "\"open",
            "\"a\\\"",
            "\"\\x\"",
            "\"\\u12\"",
            "\"\\u12g4\"",
            "\"\\ud800\"",
            "\"\\ud800x\"",
            "\"\\ud800\\n\"",
            "\"\\ud800\\u0041\"",
            "\"\\udc00\"",
            "\"tab\there\"",
            "\"nl\nhere\"",
            "\"\u{1f}\"",
        ] {
            assert_eq!(text(bad), Err(Syntax), "{bad:?}");
        }
    }

    #[test]
    fn invalid_utf8_is_found_at_any_offset() {
        // Around every word boundary, and right after the closing quote (a byte
        // the scan reads but that is not the string's).
        for at in 0..20 {
            for bad in [&[0xff_u8][..], &[0xc3], &[0xe2, 0x82], &[0xed, 0xa0, 0x80]] {
                let mut body = b"\"".to_vec();
                body.extend(std::iter::repeat_n(b'a', at));
                body.extend_from_slice(bad);
                body.extend_from_slice(b"bcdefghij\"");
                assert!(validate(&body).is_err(), "{body:x?}");
            }
            let mut fine = b"\"".to_vec();
            fine.extend(std::iter::repeat_n(b'a', at));
            fine.extend_from_slice("\u{e9}\u{1f600}\"".as_bytes());
            assert_eq!(validate(&fine), Ok(()), "{fine:x?}");
        }
        // Not JSON outside a string either.
        assert_eq!(validate(b"[\"a\"]\xc3\xa9"), Err(Syntax));
    }

    #[test]
    fn values_are_checked_as_rfc_8259_says() {
        for good in [
            "0",
            "-0",
            "12",
            "-1.5",
            "1e5",
            "1E+5",
            "2.5e-3",
            "true",
            "false",
            "null",
            "\"\"",
            "[]",
            "{}",
            " [ 1 , { \"a\" : [ null ] } ] ",
            "{\"a\":1,\"b\":\"c\"}",
        ] {
            assert_eq!(validate(good.as_bytes()), Ok(()), "{good:?}");
        }
        for bad in [
            "",
            " ",
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "+1",
            "tru",
            "nul",
            "True",
            "[1,]",
            "[,1]",
            "{\"a\"}",
            "{\"a\":}",
            "{a:1}",
            "{\"a\":1,}",
            "[1 2]",
            "[1]]",
            "{}{}",
            "\"a\" x",
            "[",
            "{",
            "NaN",
            "'a'",
        ] {
            assert_eq!(validate(bad.as_bytes()), Err(Syntax), "{bad:?}");
        }
    }

    #[test]
    fn a_lone_surrogate_is_text_only_where_nothing_decodes_it() {
        // Skipped (a value read raw, an unknown field): JSON's grammar allows it.
        assert_eq!(validate(br#"{"a":["\ud800x"],"\udc00":1}"#), Ok(()));
        // Read: a key, or a string decoded into text.
        assert_eq!(text(r#""\ud800x""#), Err(Syntax));
        let mut r = JsonReader::new(br#"{"\ud800":1}"#);
        r.object().unwrap();
        assert_eq!(r.key(true), Err(Syntax));
    }

    #[test]
    fn nesting_stops_at_the_limit() {
        let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(validate(nest(MAX_DEPTH).as_bytes()), Ok(()));
        assert_eq!(validate(nest(MAX_DEPTH + 1).as_bytes()), Err(Syntax));
        let objects = |n: usize| format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n));
        assert_eq!(validate(objects(MAX_DEPTH).as_bytes()), Ok(()));
        assert_eq!(validate(objects(MAX_DEPTH + 1).as_bytes()), Err(Syntax));
        // Depth is given back when a container closes.
        let wide = format!("[{}]", vec![nest(MAX_DEPTH - 1); 3].join(","));
        assert_eq!(validate(wide.as_bytes()), Ok(()));
    }

    #[test]
    fn a_value_is_its_bytes_without_whitespace() {
        let body = b"{ \"a\" :\n [ 1 , \"x\\ny\" ]\t, \"b\": -2e3 }";
        let mut r = JsonReader::new(body);
        r.object().unwrap();
        let a = r.key(true).unwrap().unwrap();
        assert_eq!(a.raw, b"a");
        assert_eq!(r.value(), Ok(&b"[ 1 , \"x\\ny\" ]"[..]));
        assert_eq!(r.key(false).unwrap().unwrap().raw, b"b");
        assert_eq!(r.value(), Ok(&b"-2e3"[..]));
        assert_eq!(r.key(false), Ok(None));
        assert_eq!(r.end(), Ok(()));
        // A skipped value's escapes leave no offsets behind.
        assert!(r.offsets().is_empty());
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(crate::testing::proptest_config())]

            #[test]
            fn strings_read_as_serde_json_reads_them(s in any::<String>(), ascii in "[ -~\n\t\u{1e}]{0,40}") {
                for t in [s, ascii] {
                    let body = serde_json::to_string(&t).unwrap();
                    prop_assert_eq!(text(&body), Ok(t));
                }
            }

            #[test]
            fn bodies_are_json_when_serde_json_says_so(bytes in proptest::collection::vec(
                prop_oneof![
                    Just(b'"'), Just(b'\\'), Just(b'['), Just(b']'), Just(b'{'), Just(b'}'),
                    Just(b':'), Just(b','), Just(b'u'), Just(b'0'), Just(b'd'), Just(b'8'),
                    Just(b'e'), Just(b'-'), Just(b'.'), Just(b' '), Just(b'n'), Just(0xc3),
                    Just(0xa9), Just(0x1f), any::<u8>(),
                ],
                0..24,
            )) {
                // serde_json skipping a value (`IgnoredAny`) checks what this
                // reader checks, but for UTF-8 inside strings: not JSON here.
                let ours = validate(&bytes).is_ok();
                if std::str::from_utf8(&bytes).is_err() {
                    prop_assert!(!ours);
                } else {
                    let serde = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok();
                    prop_assert_eq!(ours, serde, "{:?}", String::from_utf8_lossy(&bytes));
                }
            }
        }
    }
}
