pub mod consistency;
pub mod procs;
pub mod proctrust;
pub mod settle;
