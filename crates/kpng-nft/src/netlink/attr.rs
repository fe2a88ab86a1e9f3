//! Netlink attributes written into a message buffer: 4-byte aligned, nested ones flagged
//! `NLA_F_NESTED` and closed once their content is written.

const NLA_F_NESTED: u16 = 0x8000;

/// Appends an attribute of `kind` with `payload`, padded to 4 bytes.
pub fn put(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + ((len + 3) & !3) - len, 0);
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
