//! What a component needs from the engine's sandbox pool, read statically from its bytes: core
//! instances, linear memories (and their initial size) and tables, over every core module it
//! instantiates. `wasmop inspect` prints it; [`super::Engine::load`] refuses a module whose needs
//! exceed the pool's per-component limits with a message that names the limit, instead of an
//! opaque instantiation failure on the first call.
//!
//! # Guarantees
//! - A module instantiated twice counts twice; a core instance made from exports counts for
//!   nothing (it allocates nothing). Nested components count once each.
//! - Reading never panics on malformed bytes: it returns [`NeedsError`].
//!
//! # Errors
//! [`NeedsError`] when the bytes do not parse as a component.

use wasmparser::{ComponentOuterAliasKind, Encoding, Instance as CoreInstance, Parser, Payload};

/// The resources one instantiation of a component takes from the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Needs {
    /// Core modules the component contains.
    pub core_modules: u32,
    /// Core module instantiations.
    pub core_instances: u32,
    /// Linear memories defined by the instantiated modules.
    pub memories: u32,
    /// The sum of their initial sizes, in bytes (what every fresh sandbox starts with).
    pub initial_memory_bytes: u64,
    /// The largest initial size of one memory, in bytes (the per-call memory cap applies to
    /// each memory).
    pub largest_initial_memory_bytes: u64,
    /// Tables defined by the instantiated modules.
    pub tables: u32,
    /// The largest initial table, in elements.
    pub max_table_elements: u64,
}

/// The bytes are not a parsable component.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the component's structure: {0}")]
pub struct NeedsError(String);

/// What one core module defines.
#[derive(Debug, Clone, Copy, Default)]
struct ModuleDefines {
    memories: u32,
    initial_memory_bytes: u64,
    largest_initial_memory_bytes: u64,
    tables: u32,
    max_table_elements: u64,
}

#[derive(Debug)]
enum Frame {
    Component {
        modules: Vec<ModuleDefines>,
        needs: Needs,
    },
    Module(ModuleDefines),
}

impl Needs {
    fn add_instance(&mut self, m: &ModuleDefines) {
        self.core_instances = self.core_instances.saturating_add(1);
        self.memories = self.memories.saturating_add(m.memories);
        self.initial_memory_bytes = self
            .initial_memory_bytes
            .saturating_add(m.initial_memory_bytes);
        self.largest_initial_memory_bytes = self
            .largest_initial_memory_bytes
            .max(m.largest_initial_memory_bytes);
        self.tables = self.tables.saturating_add(m.tables);
        self.max_table_elements = self.max_table_elements.max(m.max_table_elements);
    }

    fn add_component(&mut self, n: &Needs) {
        self.core_modules = self.core_modules.saturating_add(n.core_modules);
        self.core_instances = self.core_instances.saturating_add(n.core_instances);
        self.memories = self.memories.saturating_add(n.memories);
        self.initial_memory_bytes = self
            .initial_memory_bytes
            .saturating_add(n.initial_memory_bytes);
        self.largest_initial_memory_bytes = self
            .largest_initial_memory_bytes
            .max(n.largest_initial_memory_bytes);
        self.tables = self.tables.saturating_add(n.tables);
        self.max_table_elements = self.max_table_elements.max(n.max_table_elements);
    }
}

/// Reads what `bytes` (a component) needs from the pool.
///
/// # Errors
/// [`NeedsError`] if the bytes do not parse.
pub fn needs(bytes: &[u8]) -> Result<Needs, NeedsError> {
    let mut stack: Vec<Frame> = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| NeedsError(e.to_string()))?;
        match payload {
            Payload::Version { encoding, .. } => stack.push(match encoding {
                Encoding::Component => Frame::Component {
                    modules: Vec::new(),
                    needs: Needs::default(),
                },
                Encoding::Module => Frame::Module(ModuleDefines::default()),
            }),
            Payload::MemorySection(reader) => {
                if let Some(Frame::Module(m)) = stack.last_mut() {
                    for memory in reader {
                        let memory = memory.map_err(|e| NeedsError(e.to_string()))?;
                        let page = 1u64
                            .checked_shl(memory.page_size_log2.unwrap_or(16))
                            .unwrap_or(u64::MAX);
                        let initial = memory.initial.saturating_mul(page);
                        m.memories = m.memories.saturating_add(1);
                        m.initial_memory_bytes = m.initial_memory_bytes.saturating_add(initial);
                        m.largest_initial_memory_bytes =
                            m.largest_initial_memory_bytes.max(initial);
                    }
                }
            }
            Payload::TableSection(reader) => {
                if let Some(Frame::Module(m)) = stack.last_mut() {
                    for table in reader {
                        let table = table.map_err(|e| NeedsError(e.to_string()))?;
                        m.tables = m.tables.saturating_add(1);
                        m.max_table_elements = m.max_table_elements.max(table.ty.initial);
                    }
                }
            }
            Payload::InstanceSection(reader) => {
                if let Some(Frame::Component { modules, needs }) = stack.last_mut() {
                    for instance in reader {
                        if let CoreInstance::Instantiate { module_index, .. } =
                            instance.map_err(|e| NeedsError(e.to_string()))?
                        {
                            let defines = modules
                                .get(module_index as usize)
                                .copied()
                                .unwrap_or_default();
                            needs.add_instance(&defines);
                        }
                    }
                }
            }
            Payload::ComponentAliasSection(reader) => {
                if let Some(Frame::Component { modules, .. }) = stack.last_mut() {
                    for alias in reader {
                        if let wasmparser::ComponentAlias::Outer {
                            kind: ComponentOuterAliasKind::CoreModule,
                            ..
                        } = alias.map_err(|e| NeedsError(e.to_string()))?
                        {
                            // Takes an index in the core-module space; what it defines is
                            // counted where it was defined.
                            modules.push(ModuleDefines::default());
                        }
                    }
                }
            }
            Payload::End(_) => match stack.pop() {
                Some(Frame::Module(defines)) => {
                    if let Some(Frame::Component { modules, needs }) = stack.last_mut() {
                        modules.push(defines);
                        needs.core_modules += 1;
                    }
                }
                Some(Frame::Component { needs, .. }) => match stack.last_mut() {
                    Some(Frame::Component { needs: outer, .. }) => outer.add_component(&needs),
                    Some(Frame::Module(_)) => {}
                    None => return Ok(needs),
                },
                None => {}
            },
            _ => {}
        }
    }
    Err(NeedsError("the component ends early".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes come from the module's bytes (read before anything validates them): two memories
    /// of 2 pages of 2^63 bytes each must not overflow the sums.
    #[test]
    fn huge_declared_memories_saturate_not_overflow() {
        let memory = [0x08, 0x02, 0x3f];
        let mut bytes = b"\0asm\x01\0\0\0\x05\x07\x02".to_vec();
        bytes.extend_from_slice(&memory);
        bytes.extend_from_slice(&memory);
        if let Ok(n) = needs(&bytes) {
            assert_eq!(n.initial_memory_bytes, u64::MAX);
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(needs(b"\0asm\x0d\0\x01\0\xff\xff").is_err());
        assert!(needs(b"").is_err());
    }

    #[test]
    fn a_rust_module_needs_a_few_instances_and_one_memory() {
        let bytes = std::fs::read(wasmop_test_modules::IMAGE_UPDATER).expect("the test module");
        let n = needs(&bytes).expect("parses");
        assert!(n.core_modules >= 2, "{n:?}");
        assert!((2..=8).contains(&n.core_instances), "{n:?}");
        assert_eq!(n.memories, 1, "{n:?}");
        assert!(n.largest_initial_memory_bytes >= 64 << 10, "{n:?}");
        assert_eq!(n.initial_memory_bytes, n.largest_initial_memory_bytes);
    }
}
