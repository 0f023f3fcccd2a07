//! `sync`: skeleton (owned by the core).
use super::*;

pub struct SyncProtocol;

impl SyncProtocol {
    pub fn new(_env: &ProtocolEnv) -> Self {
        SyncProtocol
    }
}

impl Protocol for SyncProtocol {
    fn name(&self) -> &'static str {
        "sync"
    }
    fn fsync(&mut self, _ino: Ino, _datasync: bool, _io: &mut Io) -> Result<()> {
        unimplemented!()
    }
    fn sync(&mut self, _io: &mut Io) -> Result<()> {
        unimplemented!()
    }
    fn write_back(&mut self, _reason: WriteBackReason, _io: &mut Io) -> Result<()> {
        unimplemented!()
    }
}
