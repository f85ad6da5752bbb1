pub mod newcomers;
pub mod taint;
