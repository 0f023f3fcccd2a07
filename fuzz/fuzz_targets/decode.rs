//! Feed arbitrary bytes to every ordo-format decoder. The first 8 bytes pick
//! the decoder parameters (descriptor size, block size, checksum layout);
//! the rest is the structure. Any panic is a bug: decoders must return a
//! `FormatError` for bad input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (selector, body) = if data.len() >= 8 {
        let (s, b) = data.split_at(8);
        (u64::from_le_bytes(s.try_into().expect("8 bytes")), b)
    } else {
        (0, data)
    };
    ordo_format::decode_any(body, selector);
});
