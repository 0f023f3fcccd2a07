//! `async`: skeleton (owned by the core).
use super::*;

pub struct AsyncProtocol;

impl AsyncProtocol {
    pub fn new(_env: &ProtocolEnv) -> Self {
        AsyncProtocol
    }
}

impl Protocol for AsyncProtocol {
    fn name(&self) -> &'static str {
        "async"
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
