//! The prompt: an OpenAI request body read once, its canonical bytes, and
//! their chain of block hashes. Imports no other room but the foundation.
//!
//! | module | job |
//! |---|---|
//! | [`json`] | a validating JSON reader that borrows every value from the body |
//! | [`openai`] | request bodies → canonical prompt bytes → [`prefix::PromptKey`]; the id a `/v1/responses` answer names (`openai::answer`) |
//! | [`prefix`] | canonical bytes → chained block hashes and the conversation anchor |

pub mod json;
pub mod openai;
pub mod prefix;
