//! proxy-wasm ABI 0.2.1 enums, as seen from the host side.

/// Status codes returned by host calls (`WasmResult` in proxy-wasm-cpp-host).
#[repr(u32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    BadArgument = 2,
    SerializationFailure = 3,
    ParseFailure = 4,
    BadExpression = 5,
    InvalidMemoryAccess = 6,
    Empty = 7,
    CasMismatch = 8,
    ResultMismatch = 9,
    InternalFailure = 10,
    BrokenConnection = 11,
    Unimplemented = 12,
}

/// Filter return values for stream callbacks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Continue,
    Pause,
    /// Any other raw value returned by the guest (not valid in ABI 0.2.1).
    Other(u32),
}

impl Action {
    pub fn from_raw(v: u32) -> Action {
        match v {
            0 => Action::Continue,
            1 => Action::Pause,
            o => Action::Other(o),
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

impl LogLevel {
    pub fn from_raw(v: u32) -> Option<LogLevel> {
        Some(match v {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            _ => return None,
        })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BufferType {
    HttpRequestBody = 0,
    HttpResponseBody = 1,
    DownstreamData = 2,
    UpstreamData = 3,
    HttpCallResponseBody = 4,
    GrpcReceiveBuffer = 5,
    VmConfiguration = 6,
    PluginConfiguration = 7,
    CallData = 8,
}

impl BufferType {
    pub fn from_raw(v: u32) -> Option<BufferType> {
        Some(match v {
            0 => BufferType::HttpRequestBody,
            1 => BufferType::HttpResponseBody,
            2 => BufferType::DownstreamData,
            3 => BufferType::UpstreamData,
            4 => BufferType::HttpCallResponseBody,
            5 => BufferType::GrpcReceiveBuffer,
            6 => BufferType::VmConfiguration,
            7 => BufferType::PluginConfiguration,
            8 => BufferType::CallData,
            _ => return None,
        })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum MapType {
    HttpRequestHeaders = 0,
    HttpRequestTrailers = 1,
    HttpResponseHeaders = 2,
    HttpResponseTrailers = 3,
    GrpcReceiveInitialMetadata = 4,
    GrpcReceiveTrailingMetadata = 5,
    HttpCallResponseHeaders = 6,
    HttpCallResponseTrailers = 7,
}

impl MapType {
    pub fn from_raw(v: u32) -> Option<MapType> {
        Some(match v {
            0 => MapType::HttpRequestHeaders,
            1 => MapType::HttpRequestTrailers,
            2 => MapType::HttpResponseHeaders,
            3 => MapType::HttpResponseTrailers,
            4 => MapType::GrpcReceiveInitialMetadata,
            5 => MapType::GrpcReceiveTrailingMetadata,
            6 => MapType::HttpCallResponseHeaders,
            7 => MapType::HttpCallResponseTrailers,
            _ => return None,
        })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum StreamType {
    HttpRequest = 0,
    HttpResponse = 1,
    Downstream = 2,
    Upstream = 3,
}

impl StreamType {
    pub fn from_raw(v: u32) -> Option<StreamType> {
        Some(match v {
            0 => StreamType::HttpRequest,
            1 => StreamType::HttpResponse,
            2 => StreamType::Downstream,
            3 => StreamType::Upstream,
            _ => return None,
        })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum MetricType {
    Counter = 0,
    Gauge = 1,
    Histogram = 2,
}

impl MetricType {
    pub fn from_raw(v: u32) -> Option<MetricType> {
        Some(match v {
            0 => MetricType::Counter,
            1 => MetricType::Gauge,
            2 => MetricType::Histogram,
            _ => return None,
        })
    }
}
