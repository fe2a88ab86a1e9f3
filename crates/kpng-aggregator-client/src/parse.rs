//! Reading nft's file structure into the model: what `kpng publish --file` reads, and what
//! the aggregator reads back from `nft -s list ruleset` to adopt its tables after a restart.
//!
//! ```text
//! table FAMILY NAME {
//!     comment "..."
//!     chain NAME { type filter hook input priority 0; policy accept; RULE ... }
//!     set NAME { type ipv4_addr . inet_service; flags interval; elements = { E, ... } }
//!     map NAME { type ipv4_addr : verdict; elements = { E : accept, ... } }
//! }
//! ```
//!
//! Only the structure is parsed: rules, declarations and elements stay nft text. Statements
//! end at a newline or `;` outside braces and quotes; `#` starts a comment to the end of
//! the line. In a chain, statements that start with `type`, `policy` or `comment` make its
//! declaration, every other is a rule.

use std::collections::BTreeMap;

use crate::model::{Chain, Family, Set, SetKind, State, Table, TableKey, check_name, collapse};

/// A malformed file: the line and the object where it went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {object}{message}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// The object being read (`table ip t chain c: `), empty at the top.
    pub object: String,
    /// What is wrong.
    pub message: String,
}

/// A parsed file: the tables, and the comment of each table that has one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// The tables.
    pub state: State,
    /// Table comments.
    pub comments: BTreeMap<TableKey, String>,
}

/// Parses nft file text.
pub fn parse(text: &str) -> Result<Parsed, ParseError> {
    let mut scanner = Scanner { chars: text.chars().collect(), at: 0, line: 1 };
    let mut parsed = Parsed::default();
    loop {
        let statement = match scanner.statement(true, "")? {
            Item::End => return Err(scanner.error("", "unexpected '}'")),
            Item::Eof => return Ok(parsed),
            Item::Statement(statement) => statement,
        };
        let words: Vec<&str> = statement.text.split_whitespace().collect();
        let (family, name) = match words.as_slice() {
            ["table", family, name] if statement.block => (*family, *name),
            _ => {
                let message =
                    format!("expected `table FAMILY NAME {{`, found {:?}", statement.text);
                return Err(ParseError { line: statement.line, object: String::new(), message });
            }
        };
        let at =
            |message: String| ParseError { line: statement.line, object: String::new(), message };
        let family: Family = family.parse().map_err(|e: crate::ModelError| at(e.to_string()))?;
        check_name("table", name).map_err(|e| at(e.to_string()))?;
        let key = TableKey::new(family, name);
        if parsed.state.tables.contains_key(&key) {
            return Err(at(format!("table {key} is declared twice")));
        }
        let (table, comment) = table_body(&mut scanner, &key)?;
        if let Some(comment) = comment {
            parsed.comments.insert(key.clone(), comment);
        }
        parsed.state.tables.insert(key, table);
    }
}

/// The top-level tables of nft's listing as `(family name, text of the whole table)`,
/// whatever their content: adoption parses only the aggregator's own tables, so a foreign
/// table with objects the model has no place for (flowtables, counters, quotas, ct
/// helpers) is still known as foreign without being read. Braces inside quotes are text.
pub fn split_tables(text: &str) -> Vec<(TableKey, &str)> {
    let mut tables = Vec::new();
    let mut depth = 0usize;
    let mut quoted = false;
    let mut start = None;
    let mut line_start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '\n' => line_start = i + 1,
            '{' if !quoted => {
                if depth == 0 {
                    start = Some(line_start);
                }
                depth += 1;
            }
            '}' if !quoted && depth > 0 => {
                depth -= 1;
                if let Some(from) = start.filter(|_| depth == 0) {
                    start = None;
                    let block = &text[from..=i];
                    let mut words = block.split_whitespace();
                    if let (Some("table"), Some(family), Some(name)) =
                        (words.next(), words.next(), words.next())
                        && let Ok(family) = family.parse::<Family>()
                    {
                        tables.push((TableKey::new(family, name), block));
                    }
                }
            }
            _ => {}
        }
    }
    tables
}

fn table_body(
    scanner: &mut Scanner,
    key: &TableKey,
) -> Result<(Table, Option<String>), ParseError> {
    let object = format!("table {key}: ");
    let mut table = Table::default();
    let mut comment = None;
    loop {
        let statement = match scanner.statement(true, &object)? {
            Item::End => return Ok((table, comment)),
            Item::Eof => return Err(scanner.error(&object, "unexpected end of file, expected '}'")),
            Item::Statement(statement) => statement,
        };
        let at =
            |message: String| ParseError { line: statement.line, object: object.clone(), message };
        let words: Vec<&str> = statement.text.split_whitespace().collect();
        match (words.as_slice(), statement.block) {
            (["chain", name], true) => {
                check_name("chain", name).map_err(|e| at(e.to_string()))?;
                let chain = chain_body(scanner, &format!("table {key} chain {name}: "))?;
                if table.chains.insert(name.to_string(), chain).is_some() {
                    return Err(at(format!("chain {name} is declared twice")));
                }
            }
            ([kind @ ("set" | "map"), name], true) => {
                check_name("set", name).map_err(|e| at(e.to_string()))?;
                let kind = if *kind == "map" { SetKind::Map } else { SetKind::Set };
                let set =
                    set_body(scanner, kind, &format!("table {key} {} {name}: ", kind.as_str()))?;
                if table.sets.insert(name.to_string(), set).is_some() {
                    return Err(at(format!("set or map {name} is declared twice")));
                }
            }
            (["comment", ..], false) => {
                let text = statement.text.trim_start_matches("comment").trim();
                comment = Some(text.trim_matches('"').to_string());
            }
            (["flags", ..], false) => {}
            _ => {
                return Err(at(format!(
                    "expected a chain, set or map, found {:?}",
                    statement.text
                )));
            }
        }
    }
}

fn chain_body(scanner: &mut Scanner, object: &str) -> Result<Chain, ParseError> {
    let mut declaration = Vec::new();
    let mut rules = Vec::new();
    loop {
        match scanner.statement(false, object)? {
            Item::End => break,
            Item::Eof => return Err(scanner.error(object, "unexpected end of file, expected '}'")),
            Item::Statement(statement) => {
                let first = statement.text.split_whitespace().next().unwrap_or("");
                if matches!(first, "type" | "policy" | "comment") {
                    declaration.push(statement.text);
                } else {
                    rules.push(statement.text);
                }
            }
        }
    }
    let declaration = (!declaration.is_empty()).then(|| declaration.join(";"));
    Ok(Chain::new(declaration.as_deref(), rules))
}

fn set_body(scanner: &mut Scanner, kind: SetKind, object: &str) -> Result<Set, ParseError> {
    let mut declaration = Vec::new();
    let mut elements = Vec::new();
    loop {
        match scanner.statement(false, object)? {
            Item::End => break,
            Item::Eof => return Err(scanner.error(object, "unexpected end of file, expected '}'")),
            Item::Statement(statement) if statement.text.starts_with("elements") => {
                let list = statement
                    .text
                    .trim_start_matches("elements")
                    .trim_start()
                    .strip_prefix('=')
                    .map(str::trim)
                    .and_then(|rest| rest.strip_prefix('{'))
                    .and_then(|rest| rest.strip_suffix('}'));
                let Some(list) = list else {
                    let message = "expected `elements = { ELEMENT, ... }`".to_string();
                    return Err(ParseError {
                        line: statement.line,
                        object: object.into(),
                        message,
                    });
                };
                elements.extend(list.split(',').map(collapse).filter(|e| !e.is_empty()));
            }
            Item::Statement(statement) => declaration.push(statement.text),
        }
    }
    if declaration.is_empty() {
        return Err(scanner.error(object, "a set or map needs a `type` or `typeof`"));
    }
    Ok(Set::new(kind, &declaration.join(";"), elements))
}

/// One statement, or the end of the enclosing block, or of the file.
enum Item {
    Statement(Statement),
    End,
    Eof,
}

struct Statement {
    text: String,
    line: usize,
    /// It ended with `{`: a block follows.
    block: bool,
}

struct Scanner {
    chars: Vec<char>,
    at: usize,
    line: usize,
}

impl Scanner {
    fn error(&self, object: &str, message: &str) -> ParseError {
        ParseError { line: self.line, object: object.to_string(), message: message.to_string() }
    }

    /// The next statement. Where `blocks`, a `{` outside braces opens a block (the
    /// statement is its head); otherwise braces are part of the statement's text.
    fn statement(&mut self, blocks: bool, object: &str) -> Result<Item, ParseError> {
        let mut text = String::new();
        let mut line = self.line;
        let mut depth = 0usize;
        let mut quoted = false;
        while let Some(&c) = self.chars.get(self.at) {
            self.at += 1;
            if quoted {
                quoted = c != '"';
                text.push(c);
                continue;
            }
            match c {
                '\n' => {
                    self.line += 1;
                    if depth == 0 && !text.trim().is_empty() {
                        break;
                    }
                    text.push(' ');
                }
                '#' => {
                    while self.chars.get(self.at).is_some_and(|&c| c != '\n') {
                        self.at += 1;
                    }
                }
                ';' if depth == 0 => {
                    if !text.trim().is_empty() {
                        break;
                    }
                }
                '"' => {
                    quoted = true;
                    text.push(c);
                }
                '{' if blocks && depth == 0 => {
                    return Ok(Item::Statement(Statement {
                        text: collapse(&text),
                        line,
                        block: true,
                    }));
                }
                '{' => {
                    depth += 1;
                    text.push(c);
                }
                '}' if depth == 0 => {
                    if text.trim().is_empty() {
                        return Ok(Item::End);
                    }
                    // The statement ends here; the block's end is read next time.
                    self.at -= 1;
                    break;
                }
                '}' => {
                    depth -= 1;
                    text.push(c);
                }
                _ => text.push(c),
            }
            if text.trim().is_empty() {
                line = self.line;
            }
        }
        if quoted || depth > 0 {
            return Err(self.error(object, "unexpected end of file inside quotes or braces"));
        }
        match text.trim().is_empty() {
            true => Ok(Item::Eof),
            false => Ok(Item::Statement(Statement { text: collapse(&text), line, block: false })),
        }
    }
}

#[cfg(test)]
mod tests;
