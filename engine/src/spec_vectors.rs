//! Test vectors of format-spec/vectors/storage tie the spec to the code.
