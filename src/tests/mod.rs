mod parsebench;
mod proptests;
