//! Metrics store with Envoy's semantics for proxy_define/increment/record/get_metric.
//!
//! Stats live per `Host` (like Envoy's stats store, shared by all workers/VMs): defining the
//! same name twice (from any VM) refers to the same stat.

use crate::types::{MetricType, Status};
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq)]
pub enum MetricValue {
    Counter(u64),
    Gauge(i64),
    Histogram(Vec<u64>),
}

impl MetricValue {
    pub fn metric_type(&self) -> MetricType {
        match self {
            MetricValue::Counter(_) => MetricType::Counter,
            MetricValue::Gauge(_) => MetricType::Gauge,
            MetricValue::Histogram(_) => MetricType::Histogram,
        }
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    by_name: BTreeMap<String, MetricValue>,
    ids: Vec<String>, // id - 1 -> name
}

impl Metrics {
    pub fn define(&mut self, ty: MetricType, name: &str) -> Result<u32, Status> {
        match self.by_name.get(name) {
            Some(existing) if existing.metric_type() != ty => return Err(Status::BadArgument),
            Some(_) => {}
            None => {
                let v = match ty {
                    MetricType::Counter => MetricValue::Counter(0),
                    MetricType::Gauge => MetricValue::Gauge(0),
                    MetricType::Histogram => MetricValue::Histogram(Vec::new()),
                };
                self.by_name.insert(name.to_string(), v);
            }
        }
        if let Some(pos) = self.ids.iter().position(|n| n == name) {
            return Ok(pos as u32 + 1);
        }
        self.ids.push(name.to_string());
        Ok(self.ids.len() as u32)
    }

    fn by_id(&mut self, id: u32) -> Result<&mut MetricValue, Status> {
        let name = self
            .ids
            .get((id as usize).wrapping_sub(1))
            .ok_or(Status::NotFound)?;
        self.by_name.get_mut(name).ok_or(Status::NotFound)
    }

    pub fn increment(&mut self, id: u32, offset: i64) -> Result<(), Status> {
        match self.by_id(id)? {
            MetricValue::Counter(c) => {
                if offset > 0 {
                    *c = c.saturating_add(offset as u64);
                    Ok(())
                } else {
                    Err(Status::BadArgument)
                }
            }
            MetricValue::Gauge(g) => {
                *g = g.saturating_add(offset);
                Ok(())
            }
            MetricValue::Histogram(_) => Err(Status::BadArgument),
        }
    }

    pub fn record(&mut self, id: u32, value: u64) -> Result<(), Status> {
        match self.by_id(id)? {
            MetricValue::Counter(c) => {
                *c = c.saturating_add(value);
            }
            MetricValue::Gauge(g) => *g = value as i64,
            MetricValue::Histogram(h) => h.push(value),
        }
        Ok(())
    }

    pub fn get(&mut self, id: u32) -> Result<u64, Status> {
        match self.by_id(id)? {
            MetricValue::Counter(c) => Ok(*c),
            MetricValue::Gauge(g) => Ok(*g as u64),
            MetricValue::Histogram(_) => Err(Status::BadArgument),
        }
    }

    pub fn by_name(&self, name: &str) -> Option<&MetricValue> {
        self.by_name.get(name)
    }

    pub fn all(&self) -> Vec<(String, MetricValue)> {
        self.by_name
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_gauge_histogram() {
        let mut m = Metrics::default();
        let c = m.define(MetricType::Counter, "c").unwrap();
        assert_eq!(m.define(MetricType::Counter, "c").unwrap(), c);
        assert_eq!(m.define(MetricType::Gauge, "c"), Err(Status::BadArgument));
        m.increment(c, 2).unwrap();
        assert_eq!(m.increment(c, -1), Err(Status::BadArgument));
        assert_eq!(m.get(c), Ok(2));
        let g = m.define(MetricType::Gauge, "g").unwrap();
        m.increment(g, 5).unwrap();
        m.increment(g, -2).unwrap();
        assert_eq!(m.get(g), Ok(3));
        m.record(g, 10).unwrap();
        assert_eq!(m.by_name("g"), Some(&MetricValue::Gauge(10)));
        let h = m.define(MetricType::Histogram, "h").unwrap();
        m.record(h, 7).unwrap();
        assert_eq!(m.get(h), Err(Status::BadArgument));
        assert_eq!(m.by_name("h"), Some(&MetricValue::Histogram(vec![7])));
        assert_eq!(m.get(99), Err(Status::NotFound));
        assert_eq!(m.get(0), Err(Status::NotFound));
    }
}
