//! Netlink attributes (`nlattr`): written into a message buffer, 4-byte aligned, nested ones
//! flagged `NLA_F_NESTED` and closed once their content is written; and read back, one
//! nesting level at a time.

/// `NLA_F_NESTED`: the attribute holds attributes.
pub const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// Appends an attribute of `kind` with `payload`, padded to 4 bytes.
pub fn put(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + ((len + 3) & !3) - len, 0);
}

/// Appends a NUL-terminated string attribute.
pub fn put_str(buf: &mut Vec<u8>, kind: u16, text: &str) {
    let mut bytes = Vec::with_capacity(text.len() + 1);
    bytes.extend_from_slice(text.as_bytes());
    bytes.push(0);
    put(buf, kind, &bytes);
}

/// Appends a 32-bit attribute in network byte order (nf_tables' convention).
pub fn put_be32(buf: &mut Vec<u8>, kind: u16, value: u32) {
    put(buf, kind, &value.to_be_bytes());
}

/// Appends a 64-bit attribute in network byte order.
pub fn put_be64(buf: &mut Vec<u8>, kind: u16, value: u64) {
    put(buf, kind, &value.to_be_bytes());
}

/// Opens a nested attribute of `kind`; returns where it starts, for [`close`].
pub fn open(buf: &mut Vec<u8>, kind: u16) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u16.to_ne_bytes());
    buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    start
}

/// Closes the nested attribute opened at `start`.
pub fn close(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

/// Writes a nested attribute of `kind` whose content `body` writes.
pub fn nested(buf: &mut Vec<u8>, kind: u16, body: impl FnOnce(&mut Vec<u8>)) {
    let start = open(buf, kind);
    body(buf);
    close(buf, start);
}

/// The attributes of one nesting level: `(type without flags, payload)`. A truncated
/// attribute ends the list.
pub fn parse(mut data: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
        let kind = u16::from_ne_bytes([data[2], data[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > data.len() {
            break;
        }
        out.push((kind, &data[4..len]));
        data = &data[((len + 3) & !3).min(data.len())..];
    }
    out
}

/// The payload of the first attribute of `kind` among `attrs`.
pub fn find<'a>(attrs: &[(u16, &'a [u8])], kind: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
}

/// A NUL-terminated string payload.
pub fn string(payload: &[u8]) -> String {
    let text = payload.split(|b| *b == 0).next().unwrap_or_default();
    String::from_utf8_lossy(text).into_owned()
}

/// A 32-bit payload in network byte order.
pub fn be32(payload: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(payload.get(..4)?.try_into().ok()?))
}

/// A 64-bit payload in network byte order.
pub fn be64(payload: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(payload.get(..8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_round_trip() {
        let mut buf = Vec::new();
        put_str(&mut buf, 1, "kpng");
        nested(&mut buf, 2, |b| {
            put_be32(b, 1, 0x0102_0304);
            put(b, 2, &[9, 9, 9]);
        });
        let top = parse(&buf);
        assert_eq!(top.len(), 2);
        assert_eq!(string(find(&top, 1).unwrap()), "kpng");
        let inner = parse(find(&top, 2).unwrap());
        assert_eq!(be32(find(&inner, 1).unwrap()), Some(0x0102_0304));
        assert_eq!(find(&inner, 2), Some(&[9u8, 9, 9][..]));
        assert_eq!(buf.len() % 4, 0, "attributes are padded to 4 bytes");
    }

    #[test]
    fn truncated_attributes_end_the_list() {
        let mut buf = Vec::new();
        put_be32(&mut buf, 1, 7);
        buf.extend_from_slice(&[200, 0, 2, 0]); // claims 200 bytes
        assert_eq!(parse(&buf).len(), 1);
    }
}
