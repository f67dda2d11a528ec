//! Reading a config file: lenient JSON (comments, trailing commas) with byte spans for every
//! value, so diagnostics can name a line and column.
