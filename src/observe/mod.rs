pub mod consistency;
pub mod container;
pub mod procs;
pub mod proctrust;
pub mod settle;
