//! Compile-only variants of a component whose largest core module fills a function table from
//! one active element segment (componentize-py's libpython: 4,955 entries at `__table_base`, a
//! table imported from another core instance). They answer what those entries cost wasmtime's
//! compile, not anything a module can do: the variants are never instantiated.
//!
//! - [`Variant::Declared`]: the segment made declarative. Its functions still escape (each
//!   keeps the array-to-wasm trampoline wasmtime compiles for a function that escapes), but the
//!   module's start-up function no longer sets the table entry by entry.
//! - [`Variant::Removed`]: the segment emptied. Nothing escapes through the table.

/// Which rewrite of the segment.
#[derive(Debug, Clone, Copy)]
pub enum Variant {
    Declared,
    Removed,
}

fn leb(b: &[u8], mut i: usize) -> (u64, usize) {
    let (mut value, mut shift) = (0u64, 0);
    loop {
        let byte = b[i];
        i += 1;
        value |= u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte < 0x80 {
            return (value, i);
        }
    }
}

/// A section: its id, where its header starts, where its body starts and ends.
struct Section {
    id: u8,
    start: usize,
    body: usize,
    end: usize,
}

/// The sections of the module or component whose preamble starts at `start` and ends at `end`.
fn sections(b: &[u8], start: usize, end: usize) -> Vec<Section> {
    let mut out = Vec::new();
    let mut i = start + 8;
    while i < end {
        let (len, body) = leb(b, i + 1);
        let end = body + usize::try_from(len).expect("a section length");
        out.push(Section {
            id: b[i],
            start: i,
            body,
            end,
        });
        i = end;
    }
    out
}

fn push_section(out: &mut Vec<u8>, id: u8, body: &[u8]) {
    out.push(id);
    wasmop_test_modules::leb(body.len(), out);
    out.extend_from_slice(body);
}

/// The element section `s` of a core module in `b`, rewritten as `variant` says.
///
/// # Panics
/// If the section is not one active segment of function indices for table 0 (flags 0), the
/// shape these benches expect of componentize-py's libpython.
fn rewrite_elements(b: &[u8], s: &Section, variant: Variant) -> Vec<u8> {
    let (count, mut i) = leb(b, s.body);
    assert!(
        count == 1 && b[i] == 0,
        "expected one active element segment of function indices (flags 0)"
    );
    i += 1;
    while b[i] != 0x0b {
        i += 1; // the offset expression (e.g. `global.get $__table_base`)
    }
    let functions = &b[i + 1..s.end];
    // One segment; flags 3: declarative, of element kind funcref (0x00).
    let mut body = vec![1, 3, 0x00];
    match variant {
        // The same vector of function indices.
        Variant::Declared => body.extend_from_slice(functions),
        // An empty vector.
        Variant::Removed => body.push(0),
    }
    let mut out = Vec::new();
    push_section(&mut out, 9, &body);
    out
}

/// `component` with the largest element section of its core modules rewritten as `variant` says.
pub fn rewrite(component: &[u8], variant: Variant) -> Vec<u8> {
    let top = sections(component, 0, component.len());
    let largest = top
        .iter()
        .filter(|s| s.id == 1)
        .filter_map(|m| {
            sections(component, m.body, m.end)
                .into_iter()
                .find(|s| s.id == 9)
                .map(|e| (m.start, e.end - e.body))
        })
        .max_by_key(|(_, len)| *len)
        .map(|(start, _)| start)
        .expect("a core module with an element section");
    let mut out = component[..8].to_vec();
    for s in &top {
        if s.start != largest {
            out.extend_from_slice(&component[s.start..s.end]);
            continue;
        }
        let mut module = component[s.body..s.body + 8].to_vec();
        for m in sections(component, s.body, s.end) {
            if m.id == 9 {
                module.extend(rewrite_elements(component, &m, variant));
            } else {
                module.extend_from_slice(&component[m.start..m.end]);
            }
        }
        push_section(&mut out, 1, &module);
    }
    out
}
