//! A fuzz input read as a script of small decisions, for the stateful
//! targets (`relay_connection`, `ops_http`): each draws bytes as it needs
//! them and reads zeros once the input runs out, so every input is a whole
//! script. Included by each with `#[path = "common/script.rs"] mod script;`.

/// Reads the input a byte at a time; zeros once it runs out.
pub struct Script<'a>(pub &'a [u8]);

impl Script<'_> {
    pub fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    pub fn done(&self) -> bool {
        self.0.is_empty()
    }

    /// Up to `n` raw bytes of the input.
    #[allow(dead_code)]
    pub fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        taken
    }
}
