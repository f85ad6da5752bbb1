pub mod capcheck;
pub mod sys;
pub mod users;
