//! The buffer cache: block images, dirty state, generations, pins, and a
//! memory bound with clean-block eviction. (Owned by the core; skeleton.)

use std::sync::Arc;

use ordo_dev::BlockClass;

/// Cached block images.
pub struct BufferCache {
    block_size: u32,
}

#[allow(unused_variables)]
impl BufferCache {
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    pub fn dirty_blocks(&self) -> Vec<u64> {
        unimplemented!()
    }
    pub fn is_dirty(&self, block: u64) -> bool {
        unimplemented!()
    }
    pub fn class_of(&self, block: u64) -> BlockClass {
        unimplemented!()
    }
    pub fn snapshot(&self, block: u64) -> Option<Arc<Vec<u8>>> {
        unimplemented!()
    }
    pub fn generation(&self, block: u64) -> u64 {
        unimplemented!()
    }
    pub fn pin(&mut self, block: u64) {
        unimplemented!()
    }
    pub fn mark_clean_if(&mut self, block: u64, gen: u64) {
        unimplemented!()
    }
}
