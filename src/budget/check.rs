//! The rules every middleware's builder keeps: a layer's name is checked
//! where it is given, and a layer that cannot work is not built (its
//! `check` error is the panic's message, at the caller's line).

use std::sync::Arc;

use crate::error::ConfigError;
use crate::name::is_layer_name;

/// `name`, once it is a layer name (1 to
/// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) characters from
/// `A-Z a-z 0-9 _ - . :`, a subset of an sf-string's, so the name goes into
/// the headers as it is).
///
/// # Errors
/// [`ConfigError::InvalidName`] for any other.
pub(crate) fn layer_name(name: String) -> Result<Arc<str>, ConfigError> {
    if !is_layer_name(&name) {
        return Err(ConfigError::InvalidName(name));
    }
    Ok(name.into())
}

/// What `result` holds; a configuration error panics with its message, at
/// the caller's line.
#[track_caller]
pub(crate) fn built<T>(result: Result<T, ConfigError>) -> T {
    match result {
        Ok(value) => value,
        Err(err) => panic!("{err}"),
    }
}
